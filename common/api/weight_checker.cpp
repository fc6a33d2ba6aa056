// POST /weight_checker of WeightSyncService (vLLM's weight checker, RFC vllm#52689): the
// workers' SHA-256 checksums of the weights they hold (collective_rpc
// compute_weight_checksums), a reset of those weights (reset_weights), or a comparison of the
// checksums with a baseline the caller took before (or the trainer computed). A lifecycle
// call: it runs in order with the weight updates it checks.

#include <map>
#include <set>

#include "common/api/replies.hpp"
#include "common/api/service.hpp"
#include "common/wire/json_text.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

using engine::CallOptions;
using engine::EngineReply;
using wire::JsonKind;

namespace {

using Checksums = std::map<std::string, std::string>;

std::string action_of(const Call& call) {
  const wire::TopLevelMember* action = call.document->find("action");
  if (action == nullptr || action->kind != JsonKind::kString) return {};
  auto handle = wire::decode(call.document->value_bytes(*action));
  const auto text = handle ? wire::as_str(handle->get()) : std::nullopt;
  return text ? std::string(*text) : std::string();
}

// Python's repr of what was sent as the action, for the 400.
std::string action_repr(const Call& call) {
  const wire::TopLevelMember* action = call.document->find("action");
  if (action == nullptr || action->kind == JsonKind::kNull) return "None";
  if (action->kind != JsonKind::kString) return "a " + std::string(wire::kind_name(action->kind));
  return "'" + action_of(call) + "'";
}

// A map of strings to strings, or nullopt.
std::optional<Checksums> string_map(const msgpack::object& object) {
  if (object.type != msgpack::type::MAP) return std::nullopt;
  Checksums map;
  for (std::uint32_t i = 0; i < object.via.map.size; ++i) {
    const auto key = wire::as_str(object.via.map.ptr[i].key);
    const auto value = wire::as_str(object.via.map.ptr[i].val);
    if (!key || !value) return std::nullopt;
    map.emplace(*key, *value);
  }
  return map;
}

std::optional<Checksums> baseline_of(const Call& call) {
  const wire::TopLevelMember* baseline = call.document->find("baseline");
  if (baseline == nullptr || baseline->kind != JsonKind::kObject) return std::nullopt;
  auto handle = wire::decode(call.document->value_bytes(*baseline));
  if (!handle) return std::nullopt;
  return string_map(handle->get());
}

// Every worker's checksums in one map; a key two workers report is a 500.
tl::expected<Checksums, ApiError> merged(const std::vector<EngineReply>& replies) {
  Checksums all;
  std::set<std::string> duplicates;
  for (const EngineReply& reply : replies) {
    auto handle = wire::decode(*reply.value);
    const msgpack::object* list = handle ? &handle->get() : nullptr;
    if (list == nullptr || list->type != msgpack::type::ARRAY) {
      return tl::unexpected(server_error("invalid weight checksums: engine rank " +
                                         std::to_string(reply.rank) + " returned no list"));
    }
    for (std::uint32_t i = 0; i < list->via.array.size; ++i) {
      auto worker = string_map(list->via.array.ptr[i]);
      if (!worker) {
        return tl::unexpected(server_error(
            "invalid weight checksums: engine rank " + std::to_string(reply.rank) + " worker " +
            std::to_string(i) + " returned something other than a map of strings"));
      }
      for (auto& [key, digest] : *worker) {
        if (!all.emplace(key, digest).second) duplicates.insert(key);
      }
    }
  }
  if (!duplicates.empty()) {
    std::string keys;
    for (const std::string& key : duplicates) keys += (keys.empty() ? "" : ", ") + key;
    return tl::unexpected(server_error("Duplicate weight checksum keys: " + keys));
  }
  return all;
}

// "dp0:pp0:pcp0:tp1:ep0" of "dp0:pp0:pcp0:tp1:ep0:model.w": the worker a key belongs to.
std::string rank_prefix(const std::string& key) {
  std::size_t from = 0;
  std::size_t at = std::string::npos;
  for (int field = 0; field < 5; ++field) {
    at = key.find(':', from);
    if (at == std::string::npos) return key;
    from = at + 1;
  }
  return key.substr(0, at);
}

std::string ranks_json(const std::vector<std::string>& keys) {
  std::set<std::string> ranks;
  for (const std::string& key : keys) ranks.insert(rank_prefix(key));
  std::string out = "[";
  for (const std::string& rank : ranks)
    out += (out.size() > 1 ? "," : "") + wire::json_string(rank);
  return out + "]";
}

std::string keys_json(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (const std::string& key : keys) out += (out.size() > 1 ? "," : "") + wire::json_string(key);
  return out + "]";
}

Response checksum_body(const Checksums& checksums) {
  std::string map = "{";
  std::vector<std::string> keys;
  for (const auto& [key, digest] : checksums) {
    map += (map.size() > 1 ? "," : "") + wire::json_string(key) + ":" + wire::json_string(digest);
    keys.push_back(key);
  }
  return {200, "{\"checksums\":" + map + "},\"ranks\":" + ranks_json(keys) + "}"};
}

// Every key either side has whose digests differ (or that one side lacks), sorted.
Response compare_body(const Checksums& reported, const Checksums& baseline) {
  std::set<std::string> keys;
  for (const auto& entry : reported) keys.insert(entry.first);
  for (const auto& entry : baseline) keys.insert(entry.first);
  std::vector<std::string> mismatches;
  for (const std::string& key : keys) {
    const auto got = reported.find(key);
    const auto want = baseline.find(key);
    if (got == reported.end() || want == baseline.end() || got->second != want->second) {
      mismatches.push_back(key);
    }
  }
  return {200, std::string("{\"match\":") + (mismatches.empty() ? "true" : "false") +
                   ",\"mismatches\":" + keys_json(mismatches) +
                   ",\"ranks\":" + ranks_json(mismatches) + "}"};
}

}  // namespace

tl::expected<std::string, ApiError> weight_checker_args(const Call& call) {
  const std::string action = action_of(call);
  if (action != "checksum" && action != "reset" && action != "compare") {
    return tl::unexpected(invalid_request(
        "action must be one of checksum|reset|compare, got " + action_repr(call), "action"));
  }
  if (action == "compare" && !baseline_of(call)) {
    return tl::unexpected(invalid_request(
        "action='compare' requires a 'baseline' object of checksum strings", "baseline"));
  }
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  packer.pack_array(4);
  wire::pack_str(packer, action == "reset" ? "reset_weights" : "compute_weight_checksums");
  packer.pack_nil();
  packer.pack_array(0);
  packer.pack_map(0);
  return buffer.take();
}

void WeightSyncService::weight_checker(const CallPtr& call, const Done& done) {
  if (auto conflict = sessions_.conflict(call->session)) return done(error_response(*conflict));
  const std::string action = action_of(*call);
  std::optional<Checksums> baseline = baseline_of(*call);
  const CallOptions call_options{options_.lifecycle_timeout, true};
  fan_out(action == "reset" ? "reset_weights" : "compute_weight_checksums", "", "collective_rpc",
          {call->engine_args}, call_options, Changes::kNothing, {},
          [action, baseline = std::move(baseline), done](const FanOut& result) {
            if (result.error) return done(error_response(*result.error, result.seconds));
            Response response{200, R"({"status":"reset"})"};
            if (action != "reset") {
              auto checksums = merged(result.replies);
              if (!checksums) return done(error_response(checksums.error(), result.seconds));
              response = action == "checksum" ? checksum_body(*checksums)
                                              : compare_body(*checksums, *baseline);
            }
            response.engine_seconds = result.seconds;
            done(std::move(response));
          });
}

}  // namespace vllmd::api
