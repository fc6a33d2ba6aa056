// ReferenceEngine's parallel layout: PP x TP x PCP workers, dense DP ranks reporting DP size 1,
// and coordinated (MoE) DP ranks forming their DP group at INIT's DP master before READY.

#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/unit/reference/frontend.hpp"

using namespace std::chrono_literals;
using namespace vllmd::test;
using vllmd::reference::DpGroup;

namespace {

// Two coordinated DP ranks on one frontend, recording the DP group each one formed.
struct CoordinatedPair {
  Frontend frontend;
  std::mutex mutex;
  std::map<int, DpGroup> groups;
  std::vector<std::unique_ptr<ReferenceEngine>> engines;

  CoordinatedPair() {
    for (int rank = 0; rank < 2; ++rank) {
      auto options = options_for(frontend);
      options.rank = rank;
      options.data_parallel_size = 2;
      options.coordinated_dp = true;
      options.dp_group_timeout = 2s;
      options.on_dp_group = [this](const DpGroup& group) {
        std::lock_guard lock(mutex);
        groups[group.rank] = group;
      };
      engines.push_back(std::make_unique<ReferenceEngine>(options));
      engines.back()->start();
    }
  }

  // INIT to each rank's HELLO, with the master `master_for` gives that rank.
  template <typename MasterFor> void send_inits(MasterFor master_for) {
    for (int i = 0; i < 2; ++i) {
      auto hello = Frontend::receive(frontend.handshake);
      REQUIRE(hello);
      const int rank = *vllmd::wire::rank_from_identity((*hello)[0]);
      Frontend::send(frontend.handshake, {(*hello)[0], frontend.init(master_for(rank))});
    }
  }

  void expect_both_fail(const std::string& rank0_error, const std::string& rank1_error) {
    for (int rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      REQUIRE(wait_until_stopped(*engines[static_cast<std::size_t>(rank)]));
      CHECK(engines[static_cast<std::size_t>(rank)]->error().find(rank == 0 ? rank0_error
                                                                            : rank1_error) == 0);
    }
  }
};

// One integer field of a registration frame.
std::int64_t registered(const std::string& frame,
                        std::optional<std::int64_t> wire::Registration::*field) {
  auto registration = wire::decode_registration(frame);
  REQUIRE(registration);
  REQUIRE((*registration).*field);
  return *((*registration).*field);
}

}  // namespace

TEST_SUITE("reference_engine_dp") {
  TEST_CASE("workers per engine and world_size are PP x TP x PCP") {
    ConnectedEngine test([](auto& options) {
      options.pipeline_parallel_size = 2;
      options.tensor_parallel_size = 2;
    });
    CHECK(registered(test.registration, &wire::Registration::world_size) == 4);
    CHECK(registered(test.registration, &wire::Registration::tensor_parallel_size) == 2);
    CHECK(registered(test.registration, &wire::Registration::pipeline_parallel_size) == 2);
    test.frontend.call(1, "collective_rpc", R"(["start_weight_update",null,[],{}])");
    CHECK(json(test.frontend.reply().value_msgpack) == "[null,null,null,null]");
  }

  TEST_CASE("prefill context parallelism counts in world_size, and refuses DP") {
    ConnectedEngine pcp([](auto& options) { options.prefill_context_parallel_size = 2; });
    CHECK(registered(pcp.registration, &wire::Registration::world_size) == 2);

    Frontend frontend;
    auto options = options_for(frontend);
    options.prefill_context_parallel_size = 2;
    options.data_parallel_size = 2;
    ReferenceEngine engine(options);
    engine.start();
    REQUIRE(wait_until_stopped(engine));
    CHECK(engine.error() == "PCP does not support data parallelism yet.");
  }

  TEST_CASE("coordinated DP ranks form their group at INIT's master and report the DP size") {
    CoordinatedPair pair;
    auto master = wire::pick_data_parallel_master("127.0.0.1", 2);
    REQUIRE(master);
    for (const auto& registration : pair.frontend.connect_all(2, *master)) {
      const int rank = registration.first;
      const auto& frame = registration.second;
      CAPTURE(rank);
      CHECK(registered(frame, &wire::Registration::data_parallel_size) == 2);
      CHECK(registered(frame, &wire::Registration::data_parallel_rank) == rank);
    }
    std::lock_guard lock(pair.mutex);
    REQUIRE(pair.groups.size() == 2);
    for (const auto& entry : pair.groups) {
      const int rank = entry.first;
      const auto& group = entry.second;
      CAPTURE(rank);
      CHECK(group.size == 2);
      CHECK(group.master == *master);
      CHECK(group.master_from_init);
      CHECK(group.group_port == master->port_list.back());  // get_next_dp_init_port()
    }
  }

  TEST_CASE("without a DP master in INIT the group never forms and startup times out") {
    CoordinatedPair pair;
    pair.send_inits([](int) { return std::nullopt; });
    // Each rank picked its own ports, as a headless vLLM does: rank 0 waits alone, rank 1
    // knocks where nobody listens.
    pair.expect_both_fail(
        "EngineCore failed to start: torch.distributed.DistStoreError: Timed out after 3 "
        "seconds waiting for clients. 1/2 clients joined.",
        "EngineCore failed to start: torch.distributed.DistNetworkError: The client socket has "
        "timed out after 2000ms while trying to connect to (127.0.0.1, ");
    CHECK(pair.groups.empty());
  }

  TEST_CASE("ranks given different DP masters refuse to form the group") {
    CoordinatedPair pair;
    auto master = wire::pick_data_parallel_master("127.0.0.1", 2);
    REQUIRE(master);
    wire::DataParallelMaster other = *master;
    other.port += 1;  // same rendezvous port, another master port
    pair.send_inits([&](int rank) { return rank == 0 ? *master : other; });
    const std::string disagree =
        "EngineCore failed to start: the DP group does not agree on its "
        "master: rank 1 holds size 2 master 127.0.0.1:";
    pair.expect_both_fail(disagree, disagree);
  }

  TEST_CASE("coordinated DP of one rank is a plain engine") {
    ConnectedEngine test([](auto& options) { options.coordinated_dp = true; });
    CHECK(registered(test.registration, &wire::Registration::data_parallel_size) == 1);
  }
}
