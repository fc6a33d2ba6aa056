#include "common/api/engine_args.hpp"

#include <charconv>

#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

namespace {

template <typename Write> std::string pack(Write&& write) {
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  write(packer);
  return buffer.take();
}

}  // namespace

tl::expected<std::string, ApiError> pause_args(const Call& call) {
  const Query& query = call.query;
  auto mode = pause_mode(query);
  if (!mode) return tl::unexpected(mode.error());
  auto clear_cache = query_bool(query, "clear_cache", true);
  if (!clear_cache) return tl::unexpected(clear_cache.error());
  return pack([&](wire::Packer& packer) {
    packer.pack_array(2);
    wire::pack_str(packer, *mode);
    packer.pack(*clear_cache);
  });
}

tl::expected<std::string, ApiError> reset_prefix_cache_args(const Call& call) {
  const Query& query = call.query;
  auto running = query_bool(query, "reset_running_requests", false);
  if (!running) return tl::unexpected(running.error());
  auto external = query_bool(query, "reset_external", false);
  if (!external) return tl::unexpected(external.error());
  return pack([&](wire::Packer& packer) {
    packer.pack_array(2);
    packer.pack(*running);
    packer.pack(*external);
  });
}

tl::expected<int, ApiError> sleep_level(const Query& query) {
  const std::string* value = query_value(query, "level");
  if (value == nullptr) return 1;
  int level = 0;
  const char* end = value->data() + value->size();
  const auto [last, error] = std::from_chars(value->data(), end, level);
  if (error != std::errc() || last != end || value->empty()) {
    return tl::unexpected(
        invalid_request("level must be an integer, got '" + *value + "'", "query.level"));
  }
  if (level < 0 || level > 2) {
    return tl::unexpected(invalid_request(
        "level must be between 0 and 2, got " + std::to_string(level), "query.level"));
  }
  return level;
}

tl::expected<std::string, ApiError> sleep_args(const Call& call) {
  const Query& query = call.query;
  auto level = sleep_level(query);
  if (!level) return tl::unexpected(level.error());
  auto mode = pause_mode(query, "query.mode");
  if (!mode) return tl::unexpected(mode.error());
  return pack([&](wire::Packer& packer) {
    packer.pack_array(2);
    packer.pack_uint64(static_cast<std::uint64_t>(*level));
    wire::pack_str(packer, *mode);
  });
}

tl::expected<std::optional<std::vector<std::string>>, ApiError> wake_tags(const Query& query) {
  std::optional<std::vector<std::string>> tags;
  for (const auto& [key, value] : query) {
    if (key != "tags") continue;  // `tags[]` and other keys are ignored, as vLLM ignores them
    // vLLM's executor warns and wakes nothing for a tag it does not know: a typo would leave
    // the weights asleep behind a 200, so it is refused here.
    if (value != "weights" && value != "kv_cache" && value != "scheduling") {
      return tl::unexpected(invalid_request(
          "tags must be weights, kv_cache or scheduling, got '" + value + "'", "query.tags"));
    }
    if (!tags) tags.emplace();
    tags->push_back(value);
  }
  return tags;
}

tl::expected<std::string, ApiError> wake_up_args(const Call& call) {
  const Query& query = call.query;
  auto tags = wake_tags(query);
  if (!tags) return tl::unexpected(tags.error());
  return pack([&](wire::Packer& packer) {
    packer.pack_array(1);
    if (!*tags) {
      packer.pack_nil();
      return;
    }
    packer.pack_array(static_cast<std::uint32_t>((*tags)->size()));
    for (const std::string& tag : **tags) wire::pack_str(packer, tag);
  });
}

}  // namespace vllmd::api
