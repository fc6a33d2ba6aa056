#include "tests/unit/api/service_fixture.hpp"

#include <utility>

#include "common/api/request.hpp"
#include "common/wire/json_text.hpp"
#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::test {

std::string error_member(const Response& response, std::string_view member) {
  auto document = wire::json_to_msgpack(response.body);
  if (!document) return "";
  const wire::TopLevelMember* error = document->find("error");
  if (error == nullptr) return "";
  auto handle = wire::decode(document->value_bytes(*error));
  if (!handle) return "";
  const msgpack::object* value = wire::find_key(handle->get(), member);
  if (value == nullptr) return "";
  const auto text = wire::as_str(*value);
  return text ? std::string(*text) : "";
}

FakeEngines::Responder succeeding(const std::string& version) {
  return [version](const RecordedCall& call, int) -> std::optional<Reply> {
    if (call.method == "get_weight_version") return string_reply(version);
    if (call.method == "is_scheduler_paused") return bool_reply(false);
    return nil();
  };
}

FakeEngines::Responder holding(const std::string& held, const std::string& version) {
  return [held, succeed = succeeding(version)](const RecordedCall& call,
                                               int rank) -> std::optional<Reply> {
    return call.name() == held ? std::nullopt : succeed(call, rank);
  };
}

ServiceFixture::ServiceFixture(int ranks, api::ServiceOptions options)
    : engines(ranks), service(engines, std::move(options)) {
  engines.set_responder(succeeding());
  engines.on_state_change = [this](const engine::EngineStatus& engine) {
    service.on_engine_state(engine);
  };
}

ServiceFixture::~ServiceFixture() { engines.on_state_change = nullptr; }

Answer ServiceFixture::send(Operation operation, Request request) {
  auto call = std::make_shared<api::Call>();
  call->route = &api::route_for(operation);
  call->query = api::parse_query(request.query);
  call->body = std::move(request.body);
  call->session = std::move(request.session);
  Answer answer;
  service.handle(call, [response = answer.response](Response reply) {
    REQUIRE_FALSE(response->has_value());  // exactly one answer per call
    *response = std::move(reply);
  });
  return answer;
}

Response ServiceFixture::run(Operation operation, Request request) {
  const Answer answer = send(operation, std::move(request));
  REQUIRE(answer.answered());
  return *answer;
}

std::string json_member(std::string_view key, std::string_view text) {
  return "{" + wire::json_string(key) + ":" + wire::json_string(text) + "}";
}

}  // namespace vllmd::test
