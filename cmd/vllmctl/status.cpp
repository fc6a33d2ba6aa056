// status: health, engines, world size, paused and weight version in one view. Every query is
// made (once) even when an earlier one failed, so the view shows as much as the daemon can tell.

#include <optional>

#include "cmd/vllmctl/commands.hpp"
#include "cmd/vllmctl/reply.hpp"
#include "common/api/errors.hpp"
#include "common/version.hpp"
#include "common/wire/json_text.hpp"

namespace vllmd::vllmctl {

namespace {

struct Field {
  std::string key;    // JSON key
  std::string label;  // text label
  std::string json = "null";
  std::string text = {};
  std::optional<Failure> failure = std::nullopt;
};

// status shows the state as it is now: no waiting out a 503 with retries.
Call snapshot(api::Operation operation) {
  Call call{operation};
  call.retry = false;
  return call;
}

// Queries one route and extracts `member` from its reply.
Field query(const Context& context, api::Operation operation, std::string key, std::string label,
            std::string_view member) {
  Field field{std::move(key), std::move(label)};
  auto reply = context.call(snapshot(operation));
  if (!reply) {
    field.failure = reply.error();
    field.text = "unavailable: " + reply.error().message;
    return field;
  }
  auto json = JsonReply::parse(reply->body);
  field.json = json ? json->json_field(member) : "null";
  auto text = json ? json->string_field(member) : std::nullopt;
  field.text = text ? *text : field.json;
  return field;
}

// "open, owned, 12.3 s old, 4 updates", "none", ... from GET /weight_update_session.
std::string session_text(const JsonReply& session) {
  auto flag = [&](std::string_view key) { return session.json_field(key) == "true"; };
  std::string text;
  if (!flag("open")) {
    text = "none";
  } else {
    text = std::string("open, ") + (flag("owned") ? "owned" : "anonymous") +
           (flag("draft") ? ", draft" : "") + ", " + session.json_field("age_seconds") +
           " s old, " + session.json_field("updates") + " update(s)";
  }
  if (!flag("version_current")) text += "; the weights changed since a version was committed";
  return text;
}

Field query_session(const Context& context) {
  Field field{"session", "session"};
  auto reply = context.call(snapshot(api::Operation::kSessionStatus));
  if (!reply) {
    field.failure = reply.error();
    field.text = "unavailable: " + reply.error().message;
    return field;
  }
  auto json = JsonReply::parse(reply->body);
  field.json = json ? reply->body : "null";
  field.text = json ? session_text(*json) : "unreadable reply";
  return field;
}

}  // namespace

int status(const Context& context) {
  auto health = context.call(snapshot(api::Operation::kHealth));
  // Without an answer from the daemon there is nothing to show.
  if (!health && !health.error().replied) return context.out().fail("status", health.error());
  const bool healthy = health.has_value();
  const std::string engines = healthy ? "all ready" : health.error().message;

  std::vector<Field> fields;
  fields.push_back(
      query(context, api::Operation::kWorldSize, "world_size", "world size", "world_size"));
  fields.push_back(query(context, api::Operation::kIsPaused, "is_paused", "paused", "is_paused"));
  fields.push_back(query(context, api::Operation::kWeightInfo, "weight_version", "weight version",
                         "weight_version"));
  fields.push_back(query_session(context));
  Field& paused = fields[1];
  if (!paused.failure) paused.text = paused.json == "true" ? "yes" : "no";

  auto line = [](std::string_view label, std::string_view value) {
    std::string text(label);
    text.resize(16, ' ');
    return text + std::string(value) + "\n";
  };
  std::string text = line("server", context.endpoint().url());
  text += line("health", healthy ? "ok" : "unhealthy");
  text += line("engines", engines);
  std::string json = "{\"server\":" + wire::json_string(context.endpoint().url()) +
                     ",\"healthy\":" + (healthy ? "true" : "false") +
                     ",\"engines\":" + wire::json_string(engines);
  std::string errors;
  int code = healthy ? api::exit_code::kOk : health.error().exit_code;
  for (const Field& field : fields) {
    text += line(field.label, field.text);
    json += ",\"" + field.key + "\":" + field.json;
    if (!field.failure) continue;
    errors += (errors.empty() ? "\"" : ",\"") + field.key +
              "\":" + wire::json_string(field.failure->message);
    if (code == api::exit_code::kOk) code = field.failure->exit_code;
  }
  if (!errors.empty()) json += ",\"errors\":{" + errors + "}";
  json += "}";
  text.pop_back();  // result() ends the block with its own newline
  context.out().result(text, json);
  return code;
}

// vllmctl's version, then the server's (GET /version): vllmd's, and the engines' vLLM once
// one registered. The client's line is printed even when the server cannot be reached.
int version(const Context& context) {
  const std::string client = std::string("vllmctl ") + kVersion;
  auto reply = context.call(Call{api::Operation::kVersion});
  std::string text = client;
  std::string json = "{\"vllmctl\":" + wire::json_string(kVersion);
  if (reply) {
    const auto server = JsonReply::parse(reply->body);
    const auto vllmd = server ? server->string_field("version") : std::nullopt;
    const auto vllm = server ? server->string_field("vllm_version") : std::nullopt;
    // vLLM's own server answers {"version": <vLLM's>}: say whose it is only when it is vllmd.
    text += "\nserver " + vllmd.value_or("?") + (vllm ? " (vLLM " + *vllm + ")" : "");
    json += ",\"server\":" + (reply->body.empty() ? std::string("null") : reply->body);
  }
  context.out().result(text, json + "}");
  if (!reply) return context.out().fail("version", reply.error());
  return api::exit_code::kOk;
}

}  // namespace vllmd::vllmctl
