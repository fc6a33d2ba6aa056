#include "common/reference/handshake.hpp"

#include <optional>
#include <stdexcept>
#include <utility>

#include "common/util/log.hpp"
#include "common/wire/messages.hpp"

namespace vllmd::reference {

namespace {

using Clock = std::chrono::steady_clock;

class Handshake {
 public:
  Handshake(const ReferenceEngineOptions& options, int world_size, EngineSockets& sockets,
            const std::function<bool(std::chrono::milliseconds)>& sleep, const std::string& prefix)
      : options_(options), faults_(options.faults), world_size_(world_size), sockets_(sockets),
        sleep_(sleep), prefix_(prefix) {
    result_.data_parallel_size = options.data_parallel_size;
  }

  HandshakeResult run() {
    result_.completed = handshake();
    return result_;
  }

 private:
  bool stopping() const { return sockets_.stopping(); }

  // vLLM's DPEngineCoreProc (MoE with DP > 1); dense ranks run as plain EngineCoreProcs.
  bool coordinated() const { return options_.coordinated_dp && options_.data_parallel_size > 1; }

  wire::Registration registration() const {
    wire::Registration registration;
    registration.empty = false;
    registration.world_size = world_size_;
    // Dense ranks are independent: run_engine_core collapses their DP size to 1.
    registration.data_parallel_size = coordinated() ? result_.data_parallel_size : 1;
    registration.tensor_parallel_size = options_.tensor_parallel_size;
    registration.pipeline_parallel_size = options_.pipeline_parallel_size;
    registration.decode_context_parallel_size = 1;
    registration.data_parallel_rank = options_.rank;
    registration.vllm_version = options_.vllm_version;
    registration.max_model_len = options_.max_model_len;
    if (options_.backend != Backend::kNone) {
      registration.weight_transfer_backend = std::string(backend_name(options_.backend));
    }
    registration.supports_draft_weight_updates = true;
    return registration;
  }

  // HELLO, INIT, registration and READY. False when stopped; throws on protocol errors.
  bool handshake() {
    util::log::info(prefix_, "connecting to ", options_.handshake_address);
    sockets_.handshake = sockets_.open(zmq::socket_type::dealer, options_.handshake_address);
    if (!sockets_.send(sockets_.handshake, wire::encode_handshake_status({"HELLO", false, true}))) {
      return false;
    }
    auto frames = sockets_.receive(sockets_.handshake, Clock::now() + options_.init_timeout);
    if (!frames) {
      if (stopping()) return false;
      throw std::runtime_error("no INIT from " + options_.handshake_address + " within " +
                               std::to_string(options_.init_timeout.count()) + " ms");
    }
    auto init = wire::decode_init(view(frames->front()));
    if (!init) throw std::runtime_error("bad INIT message: " + init.error());
    if (init->inputs.size() > 1) {
      util::log::warning(prefix_, "INIT lists ", init->inputs.size(),
                         " input/output pairs; using only the first");
    }
    // vLLM forms the DP group right after INIT, before it loads the model.
    if (coordinated() &&
        !form_dp_group(wire::decode_init_data_parallel_master(view(frames->front())))) {
      return false;
    }
    if (faults_.delay_ready.count() > 0) {  // the model load
      util::log::info(prefix_, "injected delay of ", faults_.delay_ready.count(),
                      " ms before READY");
      if (!sleep_(faults_.delay_ready)) return false;
    }
    sockets_.input = sockets_.open(zmq::socket_type::dealer, init->inputs.front());
    sockets_.output = sockets_.open(zmq::socket_type::push, init->outputs.front());

    const std::string registration_frame =
        faults_.empty_registration ? std::string() : wire::encode_registration(registration());
    const std::string ready = wire::encode_handshake_status({"READY", false, true});
    const bool sent = faults_.ready_before_registration
                          ? sockets_.send(sockets_.handshake, ready) &&
                                sockets_.send(sockets_.input, registration_frame)
                          : sockets_.send(sockets_.input, registration_frame) &&
                                sockets_.send(sockets_.handshake, ready);
    if (!sent) return false;
    // vLLM closes its handshake socket once READY is out.
    sockets_.handshake.set(zmq::sockopt::linger, kFlushLingerMs);
    sockets_.handshake.close();
    util::log::info(prefix_, "ready; inputs ", init->inputs.front(), ", outputs ",
                    init->outputs.front());
    return true;
  }

  // The DP master comes from INIT; without one the engine keeps its own, as a headless vLLM
  // does (and its group never forms). False when stopped; throws when the group cannot form.
  bool form_dp_group(const std::optional<wire::DataParallelMaster>& from_init) {
    DpGroupRequest request;
    request.rank = options_.rank;
    request.timeout = options_.dp_group_timeout;
    if (from_init) {
      request.master = *from_init;
    } else {
      auto own = own_data_parallel_master(options_.handshake_address, options_.data_parallel_size);
      if (!own) throw std::runtime_error(own.error());
      request.master = std::move(*own);
    }
    request.size = static_cast<int>(request.master.data_parallel_size);
    result_.data_parallel_size = request.size;
    util::log::info(prefix_, "forming the DP group of ", request.size, " ranks; DP master ",
                    request.master.ip, ":", request.master.port,
                    from_init ? " from INIT" : " of its own (INIT names none)");
    auto group = reference::form_dp_group(request, stop_requested());
    if (!group) {
      if (stopping()) return false;
      throw std::runtime_error("EngineCore failed to start: " + group.error());
    }
    group->master_from_init = from_init.has_value();
    util::log::info(prefix_, "DP group formed at ", group->master.ip, ":", group->group_port,
                    " (DP master ", group->master.ip, ":", group->master.port, ", ",
                    group->master_from_init ? "from INIT" : "its own", ")");
    if (options_.on_dp_group) options_.on_dp_group(*group);
    return true;
  }

  const std::atomic<bool>& stop_requested() const { return sockets_.stop_requested(); }

  const ReferenceEngineOptions& options_;
  const Faults& faults_;
  int world_size_;
  EngineSockets& sockets_;
  const std::function<bool(std::chrono::milliseconds)>& sleep_;
  const std::string& prefix_;
  HandshakeResult result_;
};

}  // namespace

HandshakeResult run_handshake(const ReferenceEngineOptions& options, int world_size,
                              EngineSockets& sockets,
                              const std::function<bool(std::chrono::milliseconds)>& sleep,
                              const std::string& log_prefix) {
  return Handshake(options, world_size, sockets, sleep, log_prefix).run();
}

}  // namespace vllmd::reference
