// weights sync: [init ->] pause -> start -> update... -> finish(version) -> resume, in one
// command; with --sleep LEVEL the colocated order of vLLM's RFC (vllm#48310): pause -> sleep
// -> wake(weights) -> start -> update... -> finish -> wake(kv_cache) -> reset prefix cache ->
// resume. Generation is resumed (and what slept woken) whatever failed, a session left open
// by a failure is closed so that a retry can start, and the version is only ever committed by
// a finish that follows successful updates (the daemon commits it after the engines' finish).
//
// On several servers the sync runs on all of them at once, and the commit is split from the
// finish: every server finishes without a version, and only when all of them did is the
// version set on each (/update_weight_version). --verify splits it the same way on one.

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "cmd/vllmctl/commands.hpp"
#include "cmd/vllmctl/inputs.hpp"
#include "cmd/vllmctl/reply.hpp"
#include "common/api/errors.hpp"
#include "common/wire/json_text.hpp"

namespace vllmd::vllmctl {

namespace {
constexpr std::string_view kCommand = "weights sync";
using Clock = std::chrono::steady_clock;

// A session id of its own, so no other client's call gets into this sync's session.
std::string fresh_session_id() {
  std::random_device random;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "vllmctl-sync-";
  for (int i = 0; i < 16; ++i) id.push_back(kHex[random() % 16]);
  return id;
}

std::string with_detail(std::string_view step, const std::string& detail) {
  return std::string(step) + (detail.empty() ? "" : " (" + detail + ")");
}

std::string step_name(std::string_view step, const std::string& detail = "") {
  return std::string(kCommand) + ": " + with_detail(step, detail);
}

double seconds_since(Clock::time_point started) {
  return std::chrono::duration<double>(Clock::now() - started).count();
}

// A JSON value for the document: the server's body as it is when it is JSON, else a string.
std::string as_json_value(const std::string& body) {
  if (body.empty()) return "null";
  return wire::json_to_msgpack(body) ? body : wire::json_string(body);
}

// What a sync does besides start/update/finish.
struct SyncPlan {
  bool pauses = true;
  std::string pause_mode = "keep";
  std::optional<int> sleep_level;       // --sleep: the colocated order
  std::optional<std::string> version;   // the version to commit
  std::optional<std::string> baseline;  // --verify: checksums the workers must hold
  bool split_commit = false;            // finish without a version, set it afterwards
};

// One step as the JSON document reports it.
struct StepRecord {
  std::string step;
  int exit_code = api::exit_code::kOk;
  double seconds = 0;
  std::string response;  // the server's JSON body, when captured
  std::string error;     // what failed, when captured
};

// One server's sync. Each step runs unless an earlier one failed; the first failure is kept.
class ServerSync {
 public:
  ServerSync(const Context& context, std::vector<InfoInput> inputs, bool has_init,
             const SyncPlan& plan, std::shared_ptr<Captured> captured)
      : context_(context), server_(context.endpoint().url()), inputs_(std::move(inputs)),
        has_init_(has_init), plan_(plan), captured_(std::move(captured)) {}

  bool ok() const { return code_ == api::exit_code::kOk; }
  int code() const { return code_; }
  bool committed() const { return committed_; }
  const std::string& server() const { return server_; }
  const std::string& outcome() const { return outcome_; }

  // [init,] pause, [sleep, wake weights,] start, update..., finish [with the version],
  // [verify]. init does not touch the served weights: generation keeps running meanwhile.
  void prepare() {
    using api::Operation;
    if (has_init_) {
      send("init", Operation::kInitWeightTransfer, inputs_[0], inputs_[0].label());
      if (!ok()) {
        outcome_ =
            "failed at " + failed_ + "; generation was not paused; weight version not committed";
        return;
      }
    }
    if (plan_.pauses) {
      step("pause", Call{Operation::kPause, {{"mode", plan_.pause_mode}}},
           "mode " + plan_.pause_mode);
    }
    if (plan_.sleep_level) {
      step("sleep", Call{Operation::kSleep, {{"level", std::to_string(*plan_.sleep_level)}}});
      step("wake up", Call{Operation::kWakeUp, {{"tags", "weights"}}}, "weights");
    }
    step("start", Call{Operation::kStartWeightUpdate});
    started_ = ok();
    send_updates();
    const bool with_version = plan_.version && !plan_.split_commit;
    const std::string body =
        with_version ? string_body("weight_version", *plan_.version) : std::string();
    step("finish",
         with_version ? Call{Operation::kFinishWeightUpdate, {}, body}
                      : Call{Operation::kFinishWeightUpdate},
         with_version ? "version " + *plan_.version : "");
    if (ok() && with_version) committed_ = true;
    if (plan_.baseline) {
      // Check what every worker holds before anything labels it.
      run("verify",
          [&] { return compare_with_baseline(context_, step_name("verify"), *plan_.baseline); });
    }
  }

  // Labels what the finish left, when the commit was split from it.
  void commit() {
    if (!plan_.split_commit || !plan_.version) return;
    const std::string body = string_body("new_version", *plan_.version);
    step("set version", Call{api::Operation::kUpdateWeightVersion, {}, body},
         "version " + *plan_.version);
    committed_ = ok();
  }

  // After the update went through: wake the KV cache and reset the prefix cache (--sleep),
  // then resume. Runs whatever failed elsewhere: the weights here are the new ones.
  void complete() {
    using api::Operation;
    if (plan_.sleep_level) {
      step("wake up", Call{Operation::kWakeUp, {{"tags", "kv_cache"}}}, "kv_cache");
      // The full wake resumes the engines' scheduler: running requests may hold blocks already.
      step("reset prefix cache",
           Call{Operation::kResetPrefixCache, {{"reset_running_requests", "true"}}});
    }
    if (!ok()) return recover();
    if (!plan_.pauses && !plan_.sleep_level) return;
    // A resume that fails fails the sync: a job reading exit 0 would go on with generation
    // paused. The weights and their version stand.
    step("resume", Call{Operation::kResume});
    if (!ok()) {
      outcome_ = "failed at resume; weight version " +
                 std::string(committed_ ? "committed" : "not committed") +
                 "; generation may still be paused";
    }
  }

  // After a failure: closes a session left open (finish without a version, so that a retry
  // can start), wakes what slept, resumes generation, and says so in the outcome.
  void recover() {
    if (!outcome_.empty()) return;  // init failed: nothing else was touched
    std::string summary =
        "failed at " + failed_ + (committed_ ? "" : "; weight version not committed");
    if (started_ && session_may_be_open()) {
      const int closed =
          always("close", Call{api::Operation::kFinishWeightUpdate}, "finish without a version");
      summary +=
          closed == api::exit_code::kOk ? "; session closed" : "; closing the session failed too";
    }
    if (plan_.sleep_level) {
      const int woken = always("wake up", Call{api::Operation::kWakeUp});
      summary += woken == api::exit_code::kOk ? "; engines woken" : "; waking failed too";
    }
    if (plan_.pauses) {
      const int resumed = always("resume", Call{api::Operation::kResume});
      summary += resumed == api::exit_code::kOk
                     ? "; generation resumed"
                     : "; resume failed too: generation may still be paused";
    }
    outcome_ = summary;
  }

  // {"server":...,"ok":...,"exit_code":...,"committed":...,"outcome":...,"steps":[...]}
  std::string document() const {
    std::string steps;
    for (const StepRecord& record : records_) {
      if (!steps.empty()) steps += ",";
      steps += "{\"step\":" + wire::json_string(record.step) +
               ",\"ok\":" + (record.exit_code == 0 ? "true" : "false") +
               ",\"exit_code\":" + std::to_string(record.exit_code) +
               ",\"seconds\":" + std::to_string(record.seconds);
      if (!record.response.empty()) steps += ",\"response\":" + as_json_value(record.response);
      if (!record.error.empty()) steps += ",\"error\":" + wire::json_string(record.error);
      steps += "}";
    }
    return "{\"server\":" + wire::json_string(server()) + ",\"ok\":" + (ok() ? "true" : "false") +
           ",\"exit_code\":" + std::to_string(code_) +
           ",\"committed\":" + (committed_ ? "true" : "false") +
           ",\"outcome\":" + wire::json_string(outcome_) + ",\"steps\":[" + steps + "]}";
  }

  void set_outcome(std::string outcome) { outcome_ = std::move(outcome); }

 private:
  // One route call as a step: skipped after a failure, else run, timed and recorded.
  void step(const std::string& name, const Call& call, const std::string& detail = "") {
    if (!ok()) return;
    code_ = always(name, call, detail);
    if (!ok()) failed_ = with_detail(name, detail);
  }

  // A step that is not one route call: `body` runs it and gives its exit code.
  void run(const std::string& name, const std::function<int()>& body) {
    if (!ok()) return;
    const auto started = Clock::now();
    code_ = body();
    record(name, code_, started);
    if (!ok()) failed_ = name;
  }

  // Sends one input file; a file that vanished since the check fails its step with 66.
  void send(const std::string& name, api::Operation operation, InfoInput& input,
            const std::string& detail) {
    if (!ok()) return;
    auto body = input.take_body();
    if (!body) {
      code_ = context_.out().fail(step_name(name, detail), body.error());
      failed_ = with_detail(name, detail);
      record(failed_, code_, Clock::now());
      return;
    }
    Call call{operation, {}, *body, detail};
    step(name, call, detail);
  }

  void send_updates() {
    const std::size_t first = has_init_ ? 1 : 0;
    const std::size_t updates = inputs_.size() - first;
    for (std::size_t i = first; i < inputs_.size(); ++i) {
      const std::string detail =
          std::to_string(i - first + 1) + "/" + std::to_string(updates) + ": " + inputs_[i].label();
      send("update", api::Operation::kUpdateWeights, inputs_[i], detail);
    }
  }

  // A call that runs even after a failure (recovery, resume); its exit code.
  int always(const std::string& name, const Call& call, const std::string& detail = "") {
    const auto started = Clock::now();
    const int code = run_step(context_, step_name(name, detail), call, detail);
    record(with_detail(name, detail), code, started);
    return code;
  }

  void record(const std::string& name, int code, Clock::time_point started) {
    StepRecord record{.step = name,
                      .exit_code = code,
                      .seconds = seconds_since(started),
                      .response = {},
                      .error = {}};
    if (captured_) {
      if (!captured_->results.empty()) record.response = captured_->results.back();
      if (!captured_->errors.empty()) record.error = captured_->errors.back();
      captured_->results.clear();
      captured_->errors.clear();
    }
    records_.push_back(std::move(record));
  }

  // Whether a weight-update session may still be open after a failed step: vllmd says (GET
  // /weight_update_session); a server without that route (vLLM's own) may hold one.
  bool session_may_be_open() const {
    auto reply = context_.call(Call{api::Operation::kSessionStatus});
    if (!reply) return true;
    const auto json = JsonReply::parse(reply->body);
    const msgpack::object* open = json ? json->field("open") : nullptr;
    return open == nullptr || open->type != msgpack::type::BOOLEAN || open->via.boolean;
  }

  Context context_;
  std::string server_;  // its URL, as reported
  std::vector<InfoInput> inputs_;
  bool has_init_;
  const SyncPlan& plan_;
  std::shared_ptr<Captured> captured_;
  int code_ = api::exit_code::kOk;
  std::string failed_;  // the step that failed, for the outcome
  bool started_ = false;
  bool committed_ = false;
  std::string outcome_;
  std::vector<StepRecord> records_;
};

// Runs `work` on every server at once (one thread each; a single server runs inline).
void on_every_server(std::vector<ServerSync>& servers,
                     const std::function<void(ServerSync&)>& work) {
  if (servers.size() == 1) return work(servers.front());
  std::vector<std::thread> threads;
  threads.reserve(servers.size());
  for (ServerSync& server : servers) threads.emplace_back([&work, &server] { work(server); });
  for (std::thread& thread : threads) thread.join();
}

// The init file (when --init), then the update files.
std::vector<InfoInput> sync_inputs(const SyncArgs& args) {
  std::vector<InfoInput> inputs;
  if (args.init) {
    inputs.emplace_back(*args.init, api::route_for(api::Operation::kInitWeightTransfer));
  }
  for (const std::string& update : args.updates) {
    inputs.emplace_back(update, api::route_for(api::Operation::kUpdateWeights));
  }
  return inputs;
}

// The first failure in server order: its exit code.
int first_failure(const std::vector<ServerSync>& servers) {
  for (const ServerSync& server : servers) {
    if (!server.ok()) return server.code();
  }
  return api::exit_code::kOk;
}

// Prints the outcome: the failures on stderr; with -o json one document on stdout; on
// several servers one line per server on stdout.
void report(const Output& out, const std::vector<ServerSync>& servers, const SyncPlan& plan,
            int code, double seconds) {
  const bool several = servers.size() > 1;
  std::size_t committed = 0;
  for (const ServerSync& server : servers) committed += server.committed() ? 1 : 0;
  const std::string version = plan.version ? "version " + *plan.version : "the weights";
  for (const ServerSync& server : servers) {
    if (server.ok()) continue;
    out.error(several ? server.server() + ": " + std::string(kCommand) : std::string(kCommand),
              server.outcome());
  }
  if (several && code != api::exit_code::kOk && plan.version) {
    out.error(kCommand, version + " committed on " + std::to_string(committed) + " of " +
                            std::to_string(servers.size()) + " servers");
  }
  std::string documents;
  std::string lines;
  for (const ServerSync& server : servers) {
    documents += (documents.empty() ? "" : ",") + server.document();
    if (several) {
      const std::string& outcome = server.outcome();
      lines += (lines.empty() ? "" : "\n") + server.server() + ": " +
               (!outcome.empty()     ? outcome
                : server.committed() ? version + " committed"
                                     : "synced");
    }
  }
  const std::string document =
      "{\"ok\":" + std::string(code == 0 ? "true" : "false") +
      ",\"exit_code\":" + std::to_string(code) +
      ",\"version\":" + (plan.version ? wire::json_string(*plan.version) : "null") +
      ",\"committed\":" + std::to_string(committed) + ",\"seconds\":" + std::to_string(seconds) +
      ",\"servers\":[" + documents + "]}";
  if (out.format() == Format::kJson || several) out.result(lines, document);
}

}  // namespace

int weights_sync(const std::vector<Context>& given, const SyncArgs& args) {
  const auto started = Clock::now();
  const Output& out = given.front().out();
  std::vector<InfoInput> inputs = sync_inputs(args);
  // All inputs are checked before generation is paused: a typo must not cost a pause.
  if (auto checked = check_inputs(inputs); !checked) return out.fail(kCommand, checked.error());
  if (args.sleep_level && args.pause_mode == "keep") {
    return out.fail(kCommand, InputError{api::exit_code::kUsage,
                                         "--pause-mode keep cannot go with --sleep: sleeping "
                                         "drops the KV cache the frozen requests hold"});
  }
  SyncPlan plan{.pauses = !args.no_pause,
                .pause_mode = args.pause_mode.value_or(args.sleep_level ? "abort" : "keep"),
                .sleep_level = args.sleep_level,
                .version = args.version,
                .baseline = std::nullopt,
                .split_commit = args.verify.has_value() || given.size() > 1};
  if (args.verify) {
    auto read = read_baseline(*args.verify);
    if (!read) return out.fail(kCommand, read.error());
    plan.baseline = std::move(*read);
  }

  // --session / VLLMCTL_SESSION when given (a session spread over commands), else a fresh one.
  const std::string session =
      given.front().session().empty() ? fresh_session_id() : given.front().session();
  const bool json = out.format() == Format::kJson;
  std::vector<ServerSync> servers;
  servers.reserve(given.size());
  for (const Context& context : given) {
    auto captured = json ? std::make_shared<Captured>() : nullptr;
    Output output =
        given.size() > 1 ? context.out().labelled(context.endpoint().url()) : context.out();
    if (captured) output = output.capturing(captured);
    servers.emplace_back(context.with_session(session).with_output(output), inputs,
                         args.init.has_value(), plan, captured);
  }

  on_every_server(servers, [](ServerSync& server) { server.prepare(); });
  const bool prepared = first_failure(servers) == api::exit_code::kOk;
  if (prepared) on_every_server(servers, [](ServerSync& server) { server.commit(); });
  on_every_server(servers, [prepared](ServerSync& server) {
    if (!server.ok()) return server.recover();
    server.complete();
    if (server.ok() && !prepared) {
      server.set_outcome("updated; weight version not committed: another server failed");
    }
  });
  const int code = first_failure(servers);
  report(out, servers, plan, code, seconds_since(started));
  return code;
}

}  // namespace vllmd::vllmctl
