// weights sync: [init ->] pause -> start -> update... -> finish(version) -> resume, in one
// command; with --sleep LEVEL the colocated order of vLLM's RFC (vllm#48310): pause -> sleep
// -> wake(weights) -> start -> update... -> finish -> wake(kv_cache) -> reset prefix cache ->
// resume. Generation is resumed (and what slept woken) whatever failed, a session left open
// by a failure is closed so that a retry can start, and the version is only ever committed by
// a finish that follows successful updates (the daemon commits it after the engines' finish).

#include <functional>
#include <random>

#include "cmd/vllmctl/commands.hpp"
#include "cmd/vllmctl/inputs.hpp"
#include "cmd/vllmctl/reply.hpp"
#include "common/api/errors.hpp"

namespace vllmd::vllmctl {

namespace {
constexpr std::string_view kCommand = "weights sync";

// A session id of its own, so no other client's call gets into this sync's session.
std::string fresh_session_id() {
  std::random_device random;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "vllmctl-sync-";
  for (int i = 0; i < 16; ++i) id.push_back(kHex[random() % 16]);
  return id;
}

std::string step_name(std::string_view step, const std::string& detail = "") {
  return std::string(kCommand) + ": " + std::string(step) +
         (detail.empty() ? "" : " (" + detail + ")");
}

// A sync's steps: each runs unless an earlier one failed; the first failure is kept.
class SyncSteps {
 public:
  explicit SyncSteps(const Context& context) : context_(context) {}

  bool ok() const { return code_ == api::exit_code::kOk; }
  int code() const { return code_; }
  const std::string& failed() const { return failed_; }  // the step that failed, for the summary

  void step(const std::string& name, const Call& call, const std::string& detail = "") {
    if (!ok()) return;
    code_ = run_step(context_, step_name(name, detail), call, detail);
    if (!ok()) failed_ = name + (detail.empty() ? "" : " (" + detail + ")");
  }

  // A step that is not one route call: `body` runs it and gives its exit code.
  void run(const std::string& name, const std::function<int()>& body) {
    if (!ok()) return;
    code_ = body();
    if (!ok()) failed_ = name;
  }

  // Sends one input file; a file that vanished since the check fails its step with 66.
  void send(const std::string& name, api::Operation operation, InfoInput& input,
            const std::string& detail) {
    if (!ok()) return;
    auto body = input.take_body();
    if (!body) {
      context_.out().error(step_name(name, detail), body.error().message);
      code_ = body.error().exit_code;
      failed_ = name + " (" + detail + ")";
      return;
    }
    step(name, Call{operation, {}, *body, detail}, detail);
  }

 private:
  const Context& context_;
  int code_ = api::exit_code::kOk;
  std::string failed_;
};

// What a sync does besides start/update/finish.
struct SyncPlan {
  bool pauses = true;
  bool sleeps = false;  // --sleep: the colocated order
};

// The init file (an empty first entry without --init), then the update files.
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

void send_updates(SyncSteps& steps, std::vector<InfoInput>& inputs, std::size_t first) {
  const std::size_t updates = inputs.size() - first;
  for (std::size_t i = first; i < inputs.size(); ++i) {
    const std::string detail =
        std::to_string(i - first + 1) + "/" + std::to_string(updates) + ": " + inputs[i].label();
    steps.send("update", api::Operation::kUpdateWeights, inputs[i], detail);
  }
}

void finish(SyncSteps& steps, const std::optional<std::string>& version) {
  using api::Operation;
  const std::string body = version ? string_body("weight_version", *version) : std::string();
  steps.step("finish",
             version ? Call{Operation::kFinishWeightUpdate, {}, body}
                     : Call{Operation::kFinishWeightUpdate},
             version ? "version " + *version : "");
}

// Whether a weight-update session may still be open after a failed step: vllmd says (GET
// /weight_update_session); a server without that route (vLLM's own) may hold one.
bool session_may_be_open(const Context& context) {
  auto reply = context.call(Call{api::Operation::kSessionStatus});
  if (!reply) return true;
  const auto json = JsonReply::parse(reply->body);
  const msgpack::object* open = json ? json->field("open") : nullptr;
  return open == nullptr || open->type != msgpack::type::BOOLEAN || open->via.boolean;
}

// After a failure: closes a session left open (finish without a version, so that a retry can
// start), wakes what slept, resumes generation; then sums up.
int recover_and_report(const Context& context, const SyncSteps& steps, const SyncPlan& plan,
                       bool started) {
  std::string summary = "failed at " + steps.failed() + "; weight version not committed";
  if (started && session_may_be_open(context)) {
    const int closed =
        run_step(context, step_name("close", "finish without a version"),
                 Call{api::Operation::kFinishWeightUpdate}, "finish without a version");
    summary +=
        closed == api::exit_code::kOk ? "; session closed" : "; closing the session failed too";
  }
  if (plan.sleeps) {
    const int woken = run_step(context, step_name("wake up"), Call{api::Operation::kWakeUp});
    summary += woken == api::exit_code::kOk ? "; engines woken" : "; waking failed too";
  }
  if (plan.pauses) {
    const int resumed = run_step(context, step_name("resume"), Call{api::Operation::kResume});
    summary += resumed == api::exit_code::kOk
                   ? "; generation resumed"
                   : "; resume failed too: generation may still be paused";
  }
  context.out().error(kCommand, summary);
  return steps.code();
}

}  // namespace

int weights_sync(const Context& given, const SyncArgs& args) {
  using api::Operation;
  // --session / VLLMCTL_SESSION when given (a session spread over commands), else a fresh one.
  const Context context = given.session().empty() ? given.with_session(fresh_session_id()) : given;
  std::vector<InfoInput> inputs = sync_inputs(args);
  // All inputs are checked before generation is paused: a typo must not cost a pause.
  if (auto checked = check_inputs(inputs); !checked) {
    context.out().error(kCommand, checked.error().message);
    return checked.error().exit_code;
  }
  const SyncPlan plan{.pauses = !args.no_pause, .sleeps = args.sleep_level.has_value()};
  std::string baseline;
  if (args.verify) {
    auto read = read_baseline(*args.verify);
    if (!read) {
      context.out().error(kCommand, read.error().message);
      return read.error().exit_code;
    }
    baseline = std::move(*read);
  }

  SyncSteps steps(context);
  // init first (once per job; --init is for a sync that also sets the transfer up): it does
  // not touch the served weights, so generation keeps running meanwhile.
  if (args.init) {
    steps.send("init", Operation::kInitWeightTransfer, inputs[0], inputs[0].label());
    if (!steps.ok()) {
      context.out().error(kCommand, "failed at " + steps.failed() +
                                        "; generation was not paused; weight version not "
                                        "committed");
      return steps.code();
    }
  }
  if (plan.pauses) steps.step("pause", Call{Operation::kPause});
  if (plan.sleeps) {
    steps.step("sleep", Call{Operation::kSleep, {{"level", std::to_string(*args.sleep_level)}}});
    steps.step("wake up", Call{Operation::kWakeUp, {{"tags", "weights"}}}, "weights");
  }
  steps.step("start", Call{Operation::kStartWeightUpdate});
  const bool started = steps.ok();
  send_updates(steps, inputs, args.init ? 1 : 0);
  if (args.verify) {
    // Finish without a version, check what every worker holds, and only then label it.
    finish(steps, std::nullopt);
    steps.run("verify",
              [&] { return compare_with_baseline(context, step_name("verify"), baseline); });
    if (args.version) {
      const std::string body = string_body("new_version", *args.version);
      steps.step("set version", Call{Operation::kUpdateWeightVersion, {}, body},
                 "version " + *args.version);
    }
  } else {
    finish(steps, args.version);
  }
  if (!steps.ok()) return recover_and_report(context, steps, plan, started);
  if (plan.sleeps) {
    steps.step("wake up", Call{Operation::kWakeUp, {{"tags", "kv_cache"}}}, "kv_cache");
    // The full wake resumes the engines' scheduler: running requests may hold blocks already.
    steps.step("reset prefix cache",
               Call{Operation::kResetPrefixCache, {{"reset_running_requests", "true"}}});
  }
  if (!steps.ok()) return recover_and_report(context, steps, plan, false);
  if (!plan.pauses && !plan.sleeps) return api::exit_code::kOk;
  const int resumed = run_step(context, step_name("resume"), Call{Operation::kResume});
  return resumed;
}

}  // namespace vllmd::vllmctl
