#include "cmd/vllmctl/commands.hpp"

#include <cctype>

#include "cmd/vllmctl/inputs.hpp"
#include "cmd/vllmctl/reply.hpp"
#include "common/api/errors.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::vllmctl {

namespace {

using api::Operation;

std::string lower_first(std::string text) {
  if (!text.empty()) text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return text;
}

// The text-mode line for a successful call.
std::string success_text(Operation operation, const std::optional<JsonReply>& json,
                         const std::string& detail) {
  const api::Route& route = api::route_for(operation);
  std::string text;
  switch (operation) {
    case Operation::kWeightInfo: {
      auto version = json ? json->string_field("weight_version") : std::nullopt;
      text = version ? *version : (json ? json->json_field("weight_version") : "");
      break;
    }
    case Operation::kWorldSize: text = json ? json->json_field("world_size") : ""; break;
    case Operation::kUpdateWeightVersion: {
      auto version = json ? json->string_field("new_version") : std::nullopt;
      text = "weight version set to " + (version ? *version : std::string("?"));
      break;
    }
    case Operation::kPause: text = "generation paused"; break;
    case Operation::kResume: text = "generation resumed"; break;
    case Operation::kHealth: text = "healthy"; break;
    case Operation::kReload: text = "configuration reloaded"; break;
    default: {
      // The message routes: the server's own words ("Weights updated"), as a status line.
      auto message = json ? json->string_field("message") : std::nullopt;
      text = lower_first(message ? *message : std::string(route.success_message));
    }
  }
  if (!detail.empty()) text += " (" + detail + ")";
  return text;
}

// Runs the inputs' calls in order (one per input), stopping at the first failure.
int run_inputs(const Context& context, const std::string& command, Operation operation,
               std::vector<InfoInput>& inputs) {
  if (auto checked = check_inputs(inputs); !checked) {
    context.out().error(command, checked.error().message);
    return checked.error().exit_code;
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string detail = inputs.size() == 1
                                   ? inputs[i].label()
                                   : std::to_string(i + 1) + "/" + std::to_string(inputs.size()) +
                                         ": " + inputs[i].label();
    auto body = inputs[i].take_body();
    if (!body) {
      context.out().error(command + " (" + detail + ")", body.error().message);
      return body.error().exit_code;
    }
    const int code = run_step(context, command + " (" + detail + ")",
                              Call{operation, {}, *body, detail}, detail);
    if (code != api::exit_code::kOk) return code;
  }
  return api::exit_code::kOk;
}

}  // namespace

std::string finish_body(const std::string& version) {
  return "{\"weight_version\":" + wire::json_string(version) + "}";
}

std::string set_version_body(const std::string& version) {
  return "{\"new_version\":" + wire::json_string(version) + "}";
}

int run_step(const Context& context, const std::string& step, const Call& call,
             const std::string& detail) {
  auto reply = context.call(call);
  if (!reply) {
    context.out().error(step, reply.error().message);
    return reply.error().exit_code;
  }
  const auto json = JsonReply::parse(reply->body);
  // /health answers 200 with an empty body; json mode still prints one document per call.
  std::string document = std::move(reply->body);
  if (document.empty())
    document = call.operation == Operation::kHealth ? "{\"healthy\":true}" : "{}";
  context.out().result(success_text(call.operation, json, detail), document);
  return api::exit_code::kOk;
}

int weights_init(const Context& context, const std::string& info) {
  std::vector<InfoInput> inputs{InfoInput(info, InfoKind::kInit)};
  return run_inputs(context, "weights init", Operation::kInitWeightTransfer, inputs);
}

int weights_start(const Context& context, bool draft) {
  // No body at all: vLLM's trainers send none, and the route ignores one.
  const Operation operation =
      draft ? Operation::kStartDraftWeightUpdate : Operation::kStartWeightUpdate;
  return run_step(context, draft ? "weights start --draft" : "weights start", Call{operation});
}

int weights_update(const Context& context, const std::vector<std::string>& infos) {
  std::vector<InfoInput> inputs;
  for (const std::string& info : infos) inputs.emplace_back(info, InfoKind::kUpdate);
  return run_inputs(context, "weights update", Operation::kUpdateWeights, inputs);
}

int weights_finish(const Context& context, const std::optional<std::string>& version) {
  if (!version) return run_step(context, "weights finish", Call{Operation::kFinishWeightUpdate});
  const std::string body = finish_body(*version);
  return run_step(context, "weights finish", Call{Operation::kFinishWeightUpdate, {}, body},
                  "version " + *version);
}

int weights_info(const Context& context) {
  return run_step(context, "weights info", Call{Operation::kWeightInfo});
}

int weights_set_version(const Context& context, const std::string& version) {
  const std::string body = set_version_body(version);
  return run_step(context, "weights set-version", Call{Operation::kUpdateWeightVersion, {}, body});
}

int world_size(const Context& context, bool include_dp) {
  Call call{Operation::kWorldSize};
  if (!include_dp) call.query.emplace_back("include_dp", "false");
  return run_step(context, "world-size", call);
}

int pause(const Context& context, const std::string& mode, bool keep_cache) {
  Call call{Operation::kPause};
  if (!mode.empty()) call.query.emplace_back("mode", mode);
  if (keep_cache) call.query.emplace_back("clear_cache", "false");
  return run_step(context, "pause", call);
}

int resume(const Context& context) { return run_step(context, "resume", Call{Operation::kResume}); }

int reload(const Context& context) { return run_step(context, "reload", Call{Operation::kReload}); }

int health(const Context& context) { return run_step(context, "health", Call{Operation::kHealth}); }

}  // namespace vllmd::vllmctl
