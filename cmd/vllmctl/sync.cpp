// weights sync: init -> pause -> start -> update... -> finish(version) -> resume, in one
// command. Generation is resumed whatever failed, and the version is only ever committed by
// a finish that follows successful updates (the daemon commits it after the engines' finish).

#include <random>

#include "cmd/vllmctl/commands.hpp"
#include "cmd/vllmctl/inputs.hpp"
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

// The init file, then the update files.
std::vector<InfoInput> sync_inputs(const SyncArgs& args) {
  std::vector<InfoInput> inputs{
      InfoInput(args.init, api::route_for(api::Operation::kInitWeightTransfer))};
  for (const std::string& update : args.updates) {
    inputs.emplace_back(update, api::route_for(api::Operation::kUpdateWeights));
  }
  return inputs;
}

void send_updates(SyncSteps& steps, std::vector<InfoInput>& inputs) {
  const std::size_t updates = inputs.size() - 1;
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    const std::string detail =
        std::to_string(i) + "/" + std::to_string(updates) + ": " + inputs[i].label();
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

// Resumes (above all after a failure: a paused server serves no one) when the sync pauses, and
// sums up a failure.
int resume_and_report(const Context& context, const SyncSteps& steps, bool pauses) {
  int resume_code = api::exit_code::kOk;
  if (pauses) resume_code = run_step(context, step_name("resume"), Call{api::Operation::kResume});
  if (steps.ok()) return resume_code;
  std::string summary = "failed at " + steps.failed() + "; weight version not committed";
  if (pauses) {
    summary += resume_code == api::exit_code::kOk
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

  SyncSteps steps(context);
  // init first: it does not touch the served weights, so generation keeps running meanwhile.
  steps.send("init", Operation::kInitWeightTransfer, inputs[0], inputs[0].label());
  if (!steps.ok()) {
    context.out().error(kCommand, "failed at " + steps.failed() +
                                      "; generation was not paused; weight version not committed");
    return steps.code();
  }
  if (!args.no_pause) steps.step("pause", Call{Operation::kPause});
  steps.step("start", Call{Operation::kStartWeightUpdate});
  send_updates(steps, inputs);
  finish(steps, args.version);
  return resume_and_report(context, steps, !args.no_pause);
}

}  // namespace vllmd::vllmctl
