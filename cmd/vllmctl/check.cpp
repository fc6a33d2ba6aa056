// weights check: what the engines' workers hold, through vllmd's /weight_checker (vLLM's
// weight checker): their SHA-256 checksums, a comparison with a baseline (a file of
// checksums the trainer computed, or an earlier `weights check -o json`), or a reset. Shared
// with weights sync --verify.

#include <fstream>
#include <iterator>

#include "cmd/vllmctl/commands.hpp"
#include "cmd/vllmctl/reply.hpp"
#include "common/api/errors.hpp"
#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::vllmctl {

namespace {

constexpr std::string_view kCommand = "weights check";

// How many of the keys to name in a message.
constexpr std::size_t kNamed = 10;

std::string key_list(const msgpack::object& keys) {
  std::string text;
  for (std::uint32_t i = 0; i < keys.via.array.size && i < kNamed; ++i) {
    const auto key = wire::as_str(keys.via.array.ptr[i]);
    text += (i > 0 ? ", " : "") + std::string(key.value_or("?"));
  }
  if (keys.via.array.size > kNamed) {
    text += " and " + std::to_string(keys.via.array.size - kNamed) + " more";
  }
  return text;
}

}  // namespace

tl::expected<std::string, CheckFailure> read_baseline(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return tl::unexpected(CheckFailure{api::exit_code::kNoInput, path + ": cannot read"});
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  auto parsed = wire::json_to_msgpack(text);
  if (!parsed || parsed->root != wire::JsonKind::kObject) {
    return tl::unexpected(CheckFailure{
        api::exit_code::kRejected, path + ": not a JSON object of checksums (key: sha256 hex)"});
  }
  // `weights check -o json` writes {"checksums": {...}, "ranks": [...]}: its checksums count.
  if (const wire::TopLevelMember* inner = parsed->find("checksums");
      inner != nullptr && inner->kind == wire::JsonKind::kObject) {
    if (auto json = JsonReply::parse(text)) return json->json_field("checksums");
  }
  return text;
}

int compare_with_baseline(const Context& context, std::string_view step,
                          const std::string& baseline) {
  const std::string body = "{\"action\":\"compare\",\"baseline\":" + baseline + "}";
  auto reply = context.call_or_report(step, Call{api::Operation::kWeightChecker, {}, body});
  if (!reply) return reply.error();
  const auto json = JsonReply::parse(reply->body);
  const msgpack::object* match = json ? json->field("match") : nullptr;
  const msgpack::object* mismatches = json ? json->field("mismatches") : nullptr;
  if (match == nullptr || match->type != msgpack::type::BOOLEAN || mismatches == nullptr ||
      mismatches->type != msgpack::type::ARRAY) {
    context.out().error(step, "the server's answer is not a weight-checker comparison");
    return api::exit_code::kEngineFailed;
  }
  if (!match->via.boolean) {
    context.out().error(step, "checksums differ on " + std::to_string(mismatches->via.array.size) +
                                  " key" + (mismatches->via.array.size == 1 ? "" : "s") + ": " +
                                  key_list(*mismatches));
    return api::exit_code::kRejected;
  }
  context.out().result("checksums match the baseline", reply->body);
  return api::exit_code::kOk;
}

int weights_check(const Context& context, const CheckArgs& args) {
  if (args.baseline) {
    auto baseline = read_baseline(*args.baseline);
    if (!baseline) return context.out().fail(kCommand, baseline.error());
    return compare_with_baseline(context, kCommand, *baseline);
  }
  const std::string body = args.reset ? R"({"action":"reset"})" : R"({"action":"checksum"})";
  auto reply = context.call_or_report(kCommand, Call{api::Operation::kWeightChecker, {}, body});
  if (!reply) return reply.error();
  if (args.reset) {
    context.out().result("weights reset", reply->body);
    return api::exit_code::kOk;
  }
  // Text: one "key digest" line per tensor per worker, sorted (the server sorts them).
  const auto json = JsonReply::parse(reply->body);
  const msgpack::object* checksums = json ? json->field("checksums") : nullptr;
  std::string text;
  if (checksums != nullptr && checksums->type == msgpack::type::MAP) {
    for (std::uint32_t i = 0; i < checksums->via.map.size; ++i) {
      const auto key = wire::as_str(checksums->via.map.ptr[i].key);
      const auto digest = wire::as_str(checksums->via.map.ptr[i].val);
      text += (text.empty() ? "" : "\n") + std::string(key.value_or("?")) + " " +
              std::string(digest.value_or("?"));
    }
  }
  context.out().result(text, reply->body);
  return api::exit_code::kOk;
}

}  // namespace vllmd::vllmctl
