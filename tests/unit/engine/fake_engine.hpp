#pragma once
// The engine side of the engine-core protocol made of raw ZeroMQ sockets, for the engine
// client's unit tests: every frame and every connection drop is the test's to choose.

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/engine/client.hpp"
#include "common/wire/messages.hpp"

namespace vllmd::test {

namespace wire = vllmd::wire;

using namespace std::chrono_literals;
using engine::ClientOptions;
using engine::EngineClient;

// Polls `predicate` every 5 ms for up to `timeout`.
inline bool eventually(const std::function<bool()>& predicate,
                       std::chrono::milliseconds timeout = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

inline std::unique_ptr<EngineClient> make_client(ClientOptions options = {}) {
  options.handshake_address = "tcp://127.0.0.1:0";
  auto client = EngineClient::create(std::move(options));
  REQUIRE_MESSAGE(client, (client ? "" : client.error()));
  return std::move(*client);
}

// The engine side of the protocol, step by step, on its own sockets.
class FakeEngine {
 public:
  explicit FakeEngine(const EngineClient& client, int rank = 0)
      : handshake_address_(client.handshake_endpoint()), rank_(rank) {}

  void hello() {
    handshake_ = dealer(handshake_address_);
    send(handshake_, wire::encode_handshake_status({"HELLO", false, true}));
    auto init = wire::decode_init(receive(handshake_, 5s).value());
    REQUIRE(init);
    input_address_ = init->inputs.front();
    output_ = zmq::socket_t(context_, zmq::socket_type::push);
    output_.set(zmq::sockopt::linger, 0);
    output_.connect(init->outputs.front());
  }

  std::optional<std::string> vllm_version;  // registered, when set before start()

  void register_and_ready() {
    connect_input();
    wire::Registration registration;
    registration.empty = false;
    registration.world_size = 1;
    registration.vllm_version = vllm_version;
    send(input_, wire::encode_registration(registration));
    send(handshake_, wire::encode_handshake_status({"READY", false, true}));
    handshake_.set(zmq::sockopt::linger, 1000);
    handshake_.close();  // as vLLM does once READY is out
  }

  void start() {
    hello();
    register_and_ready();
  }

  // A new input connection under the same identity, as ZeroMQ's reconnect makes.
  void connect_input() { input_ = dealer(input_address_); }
  void drop_input() { input_.close(); }

  // The next UTILITY request, if one comes within `timeout`.
  std::optional<wire::UtilityRequest> next_call(std::chrono::milliseconds timeout) {
    auto payload = receive(input_, timeout, 2);
    if (!payload) return std::nullopt;
    auto request = wire::decode_utility_request(*payload);
    REQUIRE(request);
    return *request;
  }

  void reply(wire::CallId call_id, std::string value_msgpack = "\xc0") {
    wire::UtilityOutput output;
    output.call_id = call_id;
    output.value_msgpack = std::move(value_msgpack);
    send_output(wire::encode_engine_core_outputs(0, output, 1234.5, 8));
  }

  void send_output(const std::string& frame) { send(output_, frame); }

  // One multipart message on the output socket (an EngineCoreOutputs and its array frames).
  void send_frames(const std::vector<std::string>& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i) {
      REQUIRE(output_.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore
                                                                         : zmq::send_flags::none));
    }
  }

  // The next message of any type on the input connection: its type byte and payload.
  std::optional<std::pair<wire::RequestType, std::string>> next_message(
      std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{input_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    zmq::message_t type;
    zmq::message_t payload;
    REQUIRE(input_.recv(type));
    REQUIRE(type.more());
    REQUIRE(input_.recv(payload));
    CHECK_FALSE(payload.more());
    return std::pair{static_cast<wire::RequestType>(*static_cast<const char*>(type.data())),
                     payload.to_string()};
  }

 private:
  zmq::socket_t dealer(const std::string& address) {
    zmq::socket_t socket(context_, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::routing_id, wire::engine_identity(rank_));
    socket.connect(address);
    return socket;
  }

  static void send(zmq::socket_t& socket, const std::string& frame) {
    REQUIRE(socket.send(zmq::buffer(frame), zmq::send_flags::none));
  }

  // The last of the message's frames (a UTILITY request is [type][payload]).
  static std::optional<std::string> receive(zmq::socket_t& socket,
                                            std::chrono::milliseconds timeout,
                                            std::size_t frames = 1) {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    std::string last;
    for (std::size_t i = 0; i < frames; ++i) {
      zmq::message_t frame;
      REQUIRE(socket.recv(frame));
      last = frame.to_string();
      if (!frame.more()) break;
    }
    return last;
  }

  zmq::context_t context_;
  std::string handshake_address_;
  int rank_ = 0;
  std::string input_address_;
  zmq::socket_t handshake_;
  zmq::socket_t input_;
  zmq::socket_t output_;
};

}  // namespace vllmd::test
