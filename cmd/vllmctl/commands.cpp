#include "cmd/vllmctl/commands.hpp"

#include <cctype>

#include "cmd/vllmctl/reply.hpp"
#include "common/api/errors.hpp"
#include "common/wire/json_text.hpp"

namespace vllmd::vllmctl {

namespace {

std::string lower_first(std::string text) {
  if (!text.empty()) text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return text;
}

// A reply member as text: a string as it is, anything else as JSON, "?" when absent.
std::string member_text(const std::optional<JsonReply>& json, std::string_view key) {
  if (!json || json->field(key) == nullptr) return "?";
  auto text = json->string_field(key);
  return text ? *text : json->json_field(key);
}

// The route's success line (Cli::success) with each "{member}" replaced by the reply's.
std::string fill_members(std::string_view format, const std::optional<JsonReply>& json) {
  std::string text;
  for (std::size_t at = 0; at < format.size();) {
    const std::size_t open = format.find('{', at);
    const std::size_t close = open == std::string_view::npos ? open : format.find('}', open);
    if (close == std::string_view::npos) {
      text += format.substr(at);
      break;
    }
    text += format.substr(at, open - at);
    text += member_text(json, format.substr(open + 1, close - open - 1));
    at = close + 1;
  }
  return text;
}

// The text-mode line for a successful call.
std::string success_text(const api::Route& route, const std::optional<JsonReply>& json,
                         const std::string& detail) {
  std::string text;
  if (!route.cli.success.empty()) {
    text = fill_members(route.cli.success, json);
  } else {
    // The message routes: the server's own words ("Weights updated"), as a status line.
    auto message = json ? json->string_field("message") : std::nullopt;
    text = lower_first(message ? *message : std::string(route.success_message));
  }
  if (!detail.empty()) text += " (" + detail + ")";
  return text;
}

}  // namespace

std::string string_body(std::string_view key, std::string_view value) {
  return "{" + wire::json_string(key) + ":" + wire::json_string(value) + "}";
}

int run_step(const Context& context, const std::string& step, const Call& call,
             const std::string& detail) {
  auto reply = context.call_or_report(step, call);
  if (!reply) return reply.error();
  const api::Route& route = api::route_for(call.operation);
  const auto json = JsonReply::parse(reply->body);
  // /health answers 200 with an empty body; json mode still prints one document per call.
  std::string document = std::move(reply->body);
  if (document.empty()) document = route.cli.empty_reply;
  context.out().result(success_text(route, json, detail), document);
  return api::exit_code::kOk;
}

int run_inputs(const Context& context, const std::string& step, const Call& call,
               std::vector<InfoInput>& inputs) {
  if (auto checked = check_inputs(inputs); !checked)
    return context.out().fail(step, checked.error());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string detail = inputs.size() == 1
                                   ? inputs[i].label()
                                   : std::to_string(i + 1) + "/" + std::to_string(inputs.size()) +
                                         ": " + inputs[i].label();
    auto body = inputs[i].take_body();
    if (!body) return context.out().fail(step + " (" + detail + ")", body.error());
    Call one = call;
    one.body = *body;
    one.progress_label = detail;
    const int code = run_step(context, step + " (" + detail + ")", one, detail);
    if (code != api::exit_code::kOk) return code;
  }
  return api::exit_code::kOk;
}

}  // namespace vllmd::vllmctl
