// Fan-out error summaries (common/api/replies.*, docs/http-api.md §4.3): the worst kind of
// failure sets the status (unavailable 503 > timeout 504 > failed 500), and every failing
// rank is named; directly, and as WeightSyncService answers a fanned-out call.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/api/replies.hpp"
#include "tests/unit/api/service_fixture.hpp"

using namespace vllmd::test;
using vllmd::api::rank_list;
using vllmd::api::summarize;
using vllmd::engine::EngineReply;

namespace {

const std::string kDead = "engine rank 2 is dead (engine restarted)";
const std::string kLate = "engine rank 1 did not answer collective_rpc within 30 s";

struct Case {
  std::vector<Reply> replies;  // by rank
  int status;
  std::string code;
  std::string details;  // after "failed to call init_weight_transfer_engine: "
};

std::vector<Case> cases() {
  return {
      {{nil(), failed("a"), nil()}, 500, "server_error", "engine rank 1: a"},
      {{failed("a"), nil(), failed("c")},
       500,
       "server_error",
       "engine rank 0: a; engine rank 2: c"},
      {{failed("a"), timed_out(kLate), nil()}, 504, "engine_timeout", "engine rank 0: a; " + kLate},
      {{nil(), timed_out(kLate), failed("c")}, 504, "engine_timeout", kLate + "; engine rank 2: c"},
      {{failed("a"), timed_out(kLate), unavailable(kDead)},
       503,
       "engine_unavailable",
       "engine rank 0: a; " + kLate + "; " + kDead},
      {{unavailable("engine rank 0 is disconnected"), timed_out(kLate), failed("c")},
       503,
       "engine_unavailable",
       "engine rank 0 is disconnected; " + kLate + "; engine rank 2: c"},
  };
}

std::vector<EngineReply> by_rank(const std::vector<Reply>& replies) {
  std::vector<EngineReply> out;
  for (std::size_t rank = 0; rank < replies.size(); ++rank) {
    out.push_back({static_cast<int>(rank), replies[rank]});
  }
  return out;
}

}  // namespace

TEST_CASE("summarize: nothing to report when every rank succeeded") {
  CHECK_FALSE(summarize("update_weights", by_rank({nil(), nil()})));
  CHECK_FALSE(summarize("update_weights", {}));
}

TEST_CASE("summarize: the worst kind wins whatever the order, and every failing rank is named") {
  for (const Case& expected : cases()) {
    const auto error = summarize("init_weight_transfer_engine", by_rank(expected.replies));
    REQUIRE(error);
    CAPTURE(expected.details);
    CHECK(error->status == expected.status);
    CHECK(error->code == expected.code);
    CHECK(error->type == "server_error");
    CHECK(error->message == "failed to call init_weight_transfer_engine: " + expected.details);
  }
}

TEST_CASE("summarize: one engine's failure is its message alone") {
  const auto error = summarize("start_weight_update", by_rank({failed("boom")}));
  REQUIRE(error);
  CHECK(error->status == 500);
  CHECK(error->message == "failed to call start_weight_update: boom");
}

TEST_CASE("a fanned-out call answers with the summary of every rank's outcome") {
  for (const Case& expected : cases()) {
    CAPTURE(expected.details);
    ServiceFixture f(3);
    const std::vector<Reply> replies = expected.replies;
    f.engines.set_responder([replies](const RecordedCall&, int rank) -> std::optional<Reply> {
      return replies[static_cast<std::size_t>(rank)];
    });
    const Response init = f.run(Operation::kInitWeightTransfer, {R"({"init_info":{"a":1}})"});
    CHECK(init.status == expected.status);
    CHECK(error_member(init, "code") == expected.code);
    CHECK(error_message(init) == "failed to call init_weight_transfer_engine: " + expected.details);
    REQUIRE(f.engines.call_count() == 1);
    CHECK(f.engines.call(0).args_json ==
          R"(["init_weight_transfer_engine",null,[],{"init_info":{"a":1}}])");
  }
}

TEST_CASE("rank lists") {
  CHECK(rank_list({1}) == "engine rank 1");
  CHECK(rank_list({0, 2}) == "engine ranks 0, 2");
}
