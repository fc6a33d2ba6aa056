#pragma once
// The DP group that coordinated (MoE) data-parallel engines form before READY, as vLLM's
// DPEngineCoreProc does with ParallelConfig.stateless_init_dp_group(): a TCP rendezvous at
// data_parallel_master_ip on the port get_next_dp_init_port() gives, where rank 0 listens and
// waits for every other rank. Here each rank also tells rank 0 the DP master and port list it
// holds, and rank 0 answers only when all N agree, so a frontend that sends no master (or
// different ones) is caught the way vLLM catches it: the group never forms and startup times out.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <tl/expected.hpp>

#include "common/wire/messages.hpp"

namespace vllmd::reference {

struct DpGroupRequest {
  int rank = 0;
  int size = 1;
  wire::DataParallelMaster master;  // as this engine holds it after INIT
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
};

// The group as one rank saw it form, for its log and --record.
struct DpGroup {
  int rank = 0;
  int size = 1;
  wire::DataParallelMaster master;  // as INIT (or the engine itself) gave it
  std::int64_t group_port = 0;      // where the rendezvous took place
  bool master_from_init = false;
};

// The DP master a headless vLLM holds when INIT names none: its own ParallelConfig's, at
// data_parallel_master_ip = --data-parallel-address (the handshake host) with random ports.
tl::expected<wire::DataParallelMaster, std::string> own_data_parallel_master(
    std::string_view handshake_address, int data_parallel_size);

// Forms the group; the error reads like the torch.distributed exception vLLM would fail its
// startup with. Returns early (with an error) once `stop` is set.
tl::expected<DpGroup, std::string> form_dp_group(const DpGroupRequest& request,
                                                 const std::atomic<bool>& stop);

}  // namespace vllmd::reference
