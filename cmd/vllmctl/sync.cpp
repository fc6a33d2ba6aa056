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
}  // namespace

int weights_sync(const Context& given, const SyncArgs& args) {
  using api::Operation;
  // --session / VLLMCTL_SESSION when given (a session spread over commands), else a fresh one.
  const Context context = given.session().empty() ? given.with_session(fresh_session_id()) : given;
  std::vector<InfoInput> inputs{
      InfoInput(args.init, api::route_for(Operation::kInitWeightTransfer))};
  for (const std::string& update : args.updates) {
    inputs.emplace_back(update, api::route_for(Operation::kUpdateWeights));
  }
  // All inputs are checked before generation is paused: a typo must not cost a pause.
  if (auto checked = check_inputs(inputs); !checked) {
    context.out().error(kCommand, checked.error().message);
    return checked.error().exit_code;
  }

  int code = api::exit_code::kOk;
  std::string failed;  // the step that failed, for the summary
  // Runs one step unless an earlier one failed; remembers the first failure.
  auto step = [&](const std::string& name, const Call& call, const std::string& detail) {
    if (code != api::exit_code::kOk) return;
    code = run_step(context, step_name(name, detail), call, detail);
    if (code != api::exit_code::kOk) failed = name + (detail.empty() ? "" : " (" + detail + ")");
  };
  // Sends one input file; a file that vanished since the check fails its step with 66.
  auto send = [&](const std::string& name, Operation operation, InfoInput& input,
                  const std::string& detail) {
    if (code != api::exit_code::kOk) return;
    auto body = input.take_body();
    if (!body) {
      context.out().error(step_name(name, detail), body.error().message);
      code = body.error().exit_code;
      failed = name + " (" + detail + ")";
      return;
    }
    step(name, Call{operation, {}, *body, detail}, detail);
  };

  // init first: it does not touch the served weights, so generation keeps running meanwhile.
  send("init", Operation::kInitWeightTransfer, inputs[0], inputs[0].label());
  if (code != api::exit_code::kOk) {
    context.out().error(kCommand, "failed at " + failed +
                                      "; generation was not paused; weight version not committed");
    return code;
  }
  if (!args.no_pause) step("pause", Call{Operation::kPause}, "");
  step("start", Call{Operation::kStartWeightUpdate}, "");
  const std::size_t updates = inputs.size() - 1;
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    const std::string detail =
        std::to_string(i) + "/" + std::to_string(updates) + ": " + inputs[i].label();
    send("update", Operation::kUpdateWeights, inputs[i], detail);
  }
  const std::string finish =
      args.version ? string_body("weight_version", *args.version) : std::string();
  step("finish",
       args.version ? Call{Operation::kFinishWeightUpdate, {}, finish}
                    : Call{Operation::kFinishWeightUpdate},
       args.version ? "version " + *args.version : "");

  // Resume even (above all) after a failure: a paused server serves no one.
  int resume_code = api::exit_code::kOk;
  if (!args.no_pause) {
    resume_code = run_step(context, step_name("resume"), Call{Operation::kResume});
  }
  if (code != api::exit_code::kOk) {
    std::string summary = "failed at " + failed + "; weight version not committed";
    if (!args.no_pause) {
      summary += resume_code == api::exit_code::kOk
                     ? "; generation resumed"
                     : "; resume failed too: generation may still be paused";
    }
    context.out().error(kCommand, summary);
    return code;
  }
  return resume_code;
}

}  // namespace vllmd::vllmctl
