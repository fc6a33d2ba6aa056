// generate: token ids in, token ids out, through POST /inference/v1/generate, for a look at
// what the engines produce (after a sync, say) without writing a client. The prompt comes
// from --tokens or a file (or stdin); the answer's ids are printed on one line, one line per
// token with its logprob under --logprobs, one line per event under --stream. -o json prints
// the server's JSON: the body, or one document per event.

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>

#include "cmd/vllmctl/commands.hpp"
#include "cmd/vllmctl/inputs.hpp"
#include "cmd/vllmctl/reply.hpp"
#include "common/api/errors.hpp"
#include "common/wire/msgpack_codec.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::vllmctl {

namespace {

constexpr std::string_view kCommand = "generate";

std::string number(double value) {
  std::string text;
  wire::append_double(text, value);
  return text;
}

tl::unexpected<InputError> refuse(int code, std::string message) {
  return tl::unexpected(InputError{code, std::move(message)});
}

// Token ids separated by commas and/or whitespace, optionally in JSON's brackets.
tl::expected<std::vector<std::int64_t>, InputError> parse_ids(std::string_view text,
                                                              std::string_view source) {
  std::vector<std::int64_t> ids;
  std::size_t at = 0;
  const auto separator = [](char c) {
    return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '[' || c == ']';
  };
  while (at < text.size()) {
    if (separator(text[at])) {
      ++at;
      continue;
    }
    std::int64_t id = 0;
    std::size_t digits = 0;
    for (; at < text.size() && !separator(text[at]); ++at, ++digits) {
      const char c = text[at];
      if (c < '0' || c > '9' || digits >= 18) {
        return refuse(api::exit_code::kUsage, std::string(source) +
                                                  ": token ids are non-negative integers, got '" +
                                                  std::string(1, c) + "'");
      }
      id = id * 10 + (c - '0');
    }
    ids.push_back(id);
  }
  if (ids.empty()) return refuse(api::exit_code::kUsage, std::string(source) + ": no token ids");
  return ids;
}

tl::expected<std::vector<std::int64_t>, InputError> prompt_ids(const GenerateArgs& args) {
  if (!args.input) return parse_ids(args.tokens, "--tokens");
  std::string text;
  if (*args.input == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::ifstream file(*args.input, std::ios::binary);
    if (!file) return refuse(api::exit_code::kNoInput, *args.input + ": cannot read");
    text.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  return parse_ids(text, *args.input == "-" ? "stdin" : *args.input);
}

std::string request_body(const std::vector<std::int64_t>& ids, const GenerateArgs& args) {
  std::string body = "{\"token_ids\":[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    body += (i == 0 ? "" : ",") + std::to_string(ids[i]);
  }
  body += "],\"stream\":";
  body += args.stream ? "true" : "false";
  body += ",\"sampling_params\":{";
  std::string params;
  const auto add = [&params](std::string_view key, const std::string& value) {
    params += (params.empty() ? "\"" : ",\"") + std::string(key) + "\":" + value;
  };
  if (args.max_tokens) add("max_tokens", std::to_string(*args.max_tokens));
  if (args.temperature) add("temperature", number(*args.temperature));
  if (args.top_p) add("top_p", number(*args.top_p));
  if (args.top_k) add("top_k", std::to_string(*args.top_k));
  if (args.seed) add("seed", std::to_string(*args.seed));
  if (args.logprobs) add("logprobs", std::to_string(*args.logprobs));
  if (args.n) add("n", std::to_string(*args.n));
  body += params;
  body += "}}";
  return body;
}

// A choice of an answer or event: its ids, and its sampled tokens' logprobs when asked.
struct Choice {
  std::int64_t index = 0;
  std::vector<std::int64_t> ids;
  std::vector<double> logprobs;
  std::string finish_reason;  // empty: not finished
};

Choice read_choice(const msgpack::object& object) {
  Choice choice;
  if (const msgpack::object* index = wire::find_value(object, "index")) {
    choice.index = wire::as_int64(*index).value_or(0);
  }
  if (const msgpack::object* ids = wire::find_value(object, "token_ids");
      ids != nullptr && ids->type == msgpack::type::ARRAY) {
    for (std::uint32_t i = 0; i < ids->via.array.size; ++i) {
      choice.ids.push_back(wire::as_int64(ids->via.array.ptr[i]).value_or(-1));
    }
  }
  if (const msgpack::object* logprobs = wire::find_value(object, "logprobs")) {
    if (const msgpack::object* content = wire::find_value(*logprobs, "content");
        content != nullptr && content->type == msgpack::type::ARRAY) {
      for (std::uint32_t i = 0; i < content->via.array.size; ++i) {
        const msgpack::object* value = wire::find_value(content->via.array.ptr[i], "logprob");
        choice.logprobs.push_back(value ? wire::as_double(*value).value_or(0) : 0);
      }
    }
  }
  if (const msgpack::object* reason = wire::find_value(object, "finish_reason")) {
    choice.finish_reason = std::string(wire::as_str(*reason).value_or(""));
  }
  return choice;
}

// The choices of an answer or event (none in the usage chunk); nullopt when it has no list.
std::optional<std::vector<Choice>> read_choices(const JsonReply& reply) {
  const msgpack::object* choices = reply.field("choices");
  if (choices == nullptr || choices->type != msgpack::type::ARRAY) return std::nullopt;
  std::vector<Choice> read;
  for (std::uint32_t i = 0; i < choices->via.array.size; ++i) {
    read.push_back(read_choice(choices->via.array.ptr[i]));
  }
  return read;
}

// The ids on one line, or one "id logprob" line per token; with several choices, each line
// starts with its choice's index and a colon.
std::string text_of(const Choice& choice, bool several) {
  const std::string lead = several ? std::to_string(choice.index) + ": " : "";
  std::string text = lead;
  for (std::size_t i = 0; i < choice.ids.size(); ++i) {
    if (choice.logprobs.size() == choice.ids.size()) {
      if (i != 0) text += '\n' + lead;
      text += std::to_string(choice.ids[i]) + ' ' + number(choice.logprobs[i]);
    } else {
      text += (i == 0 ? "" : " ") + std::to_string(choice.ids[i]);
    }
  }
  return text;
}

int streamed(const Context& context, const std::string& body, bool several) {
  const Output& out = context.out();
  std::string finish_reason;
  std::optional<api::ApiError> failed;
  std::size_t tokens = 0;
  bool done = false;
  Call call{api::Operation::kGenerate, {}, body};
  call.on_line = [&](std::string_view line) {
    if (line == "data: [DONE]") done = true;
    if (line.substr(0, 6) != "data: " || done) return;
    const std::string_view json = line.substr(6);
    auto reply = JsonReply::parse(json);
    if (!reply) return;
    if (const msgpack::object* error = reply->field("error")) {
      api::ApiError event;
      event.message = "the stream ended with an error";
      if (const msgpack::object* message = wire::find_value(*error, "message")) {
        event.message = std::string(wire::as_str(*message).value_or(event.message));
      }
      failed = event;
      return;
    }
    const auto choices = read_choices(*reply);
    if (!choices || choices->empty()) {
      if (out.format() == Format::kJson) out.result(json, json);
      return;
    }
    for (const Choice& choice : *choices) {
      tokens += choice.ids.size();
      if (!choice.finish_reason.empty()) finish_reason = choice.finish_reason;
      if (!choice.ids.empty() || out.format() == Format::kJson) {
        out.result(text_of(choice, several), json);
      }
    }
    std::fflush(stdout);
  };
  auto reply = context.call_or_report(kCommand, call);
  if (!reply) return reply.error();
  if (failed) {
    out.error(kCommand, failed->message);
    return api::exit_code::kEngineFailed;
  }
  if (!done) {  // vllmd ends every stream with [DONE]: this one was cut short
    out.error(kCommand,
              "the stream ended without [DONE] after " + std::to_string(tokens) + " token(s)");
    return api::exit_code::kEngineFailed;
  }
  out.note(std::string(kCommand) + ": " + std::to_string(tokens) + " token(s), finish_reason " +
           (finish_reason.empty() ? "none" : finish_reason));
  return api::exit_code::kOk;
}

}  // namespace

int generate(const Context& context, const GenerateArgs& args) {
  const Output& out = context.out();
  auto ids = prompt_ids(args);
  if (!ids) return out.fail(kCommand, ids.error());
  const std::string body = request_body(*ids, args);
  const bool several = args.n.value_or(1) > 1;
  if (args.stream) return streamed(context, body, several);
  auto reply = context.call_or_report(kCommand, Call{api::Operation::kGenerate, {}, body});
  if (!reply) return reply.error();
  const auto json = JsonReply::parse(reply->body);
  const auto choices = json ? read_choices(*json) : std::nullopt;
  if (!choices || choices->empty()) {
    out.error(kCommand, "the server's answer has no choice");
    return api::exit_code::kEngineFailed;
  }
  std::string text;
  std::size_t tokens = 0;
  std::string reasons;
  for (const Choice& choice : *choices) {
    if (!text.empty()) text += '\n';
    text += text_of(choice, several);
    tokens += choice.ids.size();
    if (reasons.find(choice.finish_reason) == std::string::npos) {
      reasons += (reasons.empty() ? "" : ",") + choice.finish_reason;
    }
  }
  out.result(text, reply->body);
  out.note(std::string(kCommand) + ": " + std::to_string(tokens) + " token(s), finish_reason " +
           reasons);
  return api::exit_code::kOk;
}

}  // namespace vllmd::vllmctl
