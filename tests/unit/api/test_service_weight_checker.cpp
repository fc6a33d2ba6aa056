// WeightSyncService's /weight_checker (common/api/weight_checker.cpp): the workers'
// checksums merged, a reset, a comparison with a baseline, and the 400s that reach no engine
// (the cases of vLLM's Rust frontend tests).

#include <doctest/doctest.h>

#include "common/wire/json_to_msgpack.hpp"
#include "tests/unit/api/service_fixture.hpp"

using namespace vllmd::test;

namespace {

Reply json_reply(std::string_view json) {
  return Reply(vllmd::wire::json_to_msgpack(json).value().msgpack.str());
}

// Every engine answers collective_rpc with `json`.
FakeEngines::Responder answering(std::string json) {
  return [json = std::move(json)](const RecordedCall&, int) -> std::optional<Reply> {
    return json_reply(json);
  };
}

Request body(std::string json) { return {std::move(json)}; }

}  // namespace

TEST_CASE("checksum merges every worker's map; compare lists the differing keys") {
  ServiceFixture f(1);
  f.engines.set_responder(answering(R"([{"dp0:pp0:pcp0:tp0:ep0:a":"1"},)"
                                    R"({"dp0:pp0:pcp0:tp1:ep0:a":"2"}])"));
  const Response checksums = f.run(Operation::kWeightChecker, body(R"({"action":"checksum"})"));
  CHECK(checksums.status == 200);
  CHECK(checksums.body == R"({"checksums":{"dp0:pp0:pcp0:tp0:ep0:a":"1",)"
                          R"("dp0:pp0:pcp0:tp1:ep0:a":"2"},)"
                          R"("ranks":["dp0:pp0:pcp0:tp0:ep0","dp0:pp0:pcp0:tp1:ep0"]})");
  CHECK(f.engines.call(0).method == "collective_rpc");
  CHECK(f.engines.call(0).args_json == R"(["compute_weight_checksums",null,[],{}])");

  const Response compared =
      f.run(Operation::kWeightChecker,
            body(R"({"action":"compare","baseline":{"dp0:pp0:pcp0:tp0:ep0:a":"1",)"
                 R"("dp0:pp0:pcp0:tp1:ep0:a":"9","dp0:pp0:pcp0:tp2:ep0:a":"3"}})"));
  CHECK(compared.body == R"({"match":false,"mismatches":["dp0:pp0:pcp0:tp1:ep0:a",)"
                         R"("dp0:pp0:pcp0:tp2:ep0:a"],)"
                         R"("ranks":["dp0:pp0:pcp0:tp1:ep0","dp0:pp0:pcp0:tp2:ep0"]})");
  const Response same =
      f.run(Operation::kWeightChecker,
            body(R"({"action":"compare","baseline":{"dp0:pp0:pcp0:tp0:ep0:a":"1",)"
                 R"("dp0:pp0:pcp0:tp1:ep0:a":"2"}})"));
  CHECK(same.body == R"({"match":true,"mismatches":[],"ranks":[]})");
}

TEST_CASE("reset sends reset_weights") {
  ServiceFixture f(2);
  f.engines.set_responder(answering("[null,null]"));
  const Response reset = f.run(Operation::kWeightChecker, body(R"({"action":"reset"})"));
  CHECK(reset.status == 200);
  CHECK(reset.body == R"({"status":"reset"})");
  CHECK(f.engines.call(0).args_json == R"(["reset_weights",null,[],{}])");
  CHECK(f.engines.call(0).ranks == Ranks{0, 1});
}

TEST_CASE("a key two workers report is a 500 naming it") {
  ServiceFixture f(2);
  f.engines.set_responder(answering(R"([{"k1":"1","k2":"2"}])"));
  const Response response = f.run(Operation::kWeightChecker, body(R"({"action":"checksum"})"));
  CHECK(response.status == 500);
  CHECK(error_message(response) == "Duplicate weight checksum keys: k1, k2");
}

TEST_CASE("bodies that never reach an engine") {
  ServiceFixture f(1);
  for (const char* text : {"{}", R"({"action":"frobnicate"})", R"({"action":"compare"})",
                           R"({"action":"compare","baseline":{"k":1}})", R"({"action":3})"}) {
    CAPTURE(text);
    CHECK(f.run(Operation::kWeightChecker, body(text)).status == 400);
  }
  const Response none = f.run(Operation::kWeightChecker, body("{}"));
  CHECK(error_message(none) == "action must be one of checksum|reset|compare, got None");
  CHECK(error_member(none, "param") == "action");
  const Response bad = f.run(Operation::kWeightChecker, body(R"({"action":"frobnicate"})"));
  CHECK(error_message(bad) == "action must be one of checksum|reset|compare, got 'frobnicate'");
  CHECK(f.engines.call_count() == 0);
}
