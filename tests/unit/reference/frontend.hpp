#pragma once
// A minimal frontend made of raw ZeroMQ sockets for ReferenceEngine tests: it binds the
// handshake ROUTER, input ROUTER and output PULL on loopback port 0 and speaks the handshake.

#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/reference/engine.hpp"
#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/messages.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::test {

using namespace std::chrono_literals;
using reference::ReferenceEngine;
using reference::ReferenceEngineOptions;
namespace wire = vllmd::wire;

inline constexpr auto kTimeout = 5s;

using Frames = std::vector<std::string>;

// The frontend side: binds handshake ROUTER, input ROUTER and output PULL on loopback port 0.
struct Frontend {
  zmq::context_t context;
  zmq::socket_t handshake{context, zmq::socket_type::router};
  zmq::socket_t input{context, zmq::socket_type::router};
  zmq::socket_t output{context, zmq::socket_type::pull};
  std::string handshake_address;
  std::string input_address;
  std::string output_address;
  std::string identity;  // of the engine, from its HELLO

  Frontend() {
    handshake_address = bind(handshake);
    input_address = bind(input);
    output_address = bind(output);
  }

  static std::string bind(zmq::socket_t& socket) {
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::rcvhwm, 0);  // as vLLM's frontend: thousands of calls in flight
    socket.set(zmq::sockopt::sndhwm, 0);
    socket.bind("tcp://127.0.0.1:0");
    return socket.get(zmq::sockopt::last_endpoint);
  }

  // The next message's frames; nullopt after `timeout`.
  static std::optional<Frames> receive(zmq::socket_t& socket,
                                       std::chrono::milliseconds timeout = kTimeout) {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    Frames frames;
    zmq::message_t frame;
    do {
      REQUIRE(socket.recv(frame, zmq::recv_flags::none));
      frames.push_back(frame.to_string());
    } while (frame.more());
    return frames;
  }

  static void send(zmq::socket_t& socket, const Frames& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i) {
      const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      REQUIRE(socket.send(zmq::buffer(frames[i]), flags));
    }
  }

  std::string init(const std::optional<wire::DataParallelMaster>& master = std::nullopt) const {
    return wire::encode_init({{input_address}, {output_address}}, master);
  }

  // Takes HELLO, sends INIT; returns the registration frame after checking READY arrived.
  std::string connect(int rank = 0) {
    auto hello = receive(handshake);
    REQUIRE(hello);
    REQUIRE(hello->size() == 2);
    identity = (*hello)[0];
    CHECK(identity == wire::engine_identity(rank));
    auto status = wire::decode_handshake_status((*hello)[1]);
    REQUIRE(status);
    CHECK(status->status == "HELLO");
    CHECK_FALSE(status->local);
    CHECK(status->headless);
    send(handshake, {identity, init()});

    auto ready = receive(handshake);
    REQUIRE(ready);
    REQUIRE(ready->size() == 2);
    CHECK((*ready)[0] == identity);
    auto ready_status = wire::decode_handshake_status((*ready)[1]);
    REQUIRE(ready_status);
    CHECK(ready_status->status == "READY");
    auto registration = receive(input);
    REQUIRE(registration);
    REQUIRE(registration->size() == 2);
    CHECK((*registration)[0] == identity);
    return (*registration)[1];
  }

  // Several engines at once: INIT (with `master`) to each HELLO, then every READY and
  // registration, in whatever order they come. Returns the registrations by rank.
  std::map<int, std::string> connect_all(int engines,
                                         const std::optional<wire::DataParallelMaster>& master) {
    for (int i = 0; i < engines; ++i) {
      auto hello = receive(handshake);
      REQUIRE(hello);
      send(handshake, {(*hello)[0], init(master)});
    }
    std::map<int, std::string> registrations;
    int ready = 0;
    while (ready < engines || static_cast<int>(registrations.size()) < engines) {
      zmq::pollitem_t items[] = {{handshake.handle(), 0, ZMQ_POLLIN, 0},
                                 {input.handle(), 0, ZMQ_POLLIN, 0}};
      REQUIRE(zmq::poll(items, 2, kTimeout) > 0);
      if (items[0].revents & ZMQ_POLLIN) {
        auto frames = receive(handshake);
        REQUIRE(frames);
        ++ready;
      }
      if (items[1].revents & ZMQ_POLLIN) {
        auto frames = receive(input);
        REQUIRE(frames);
        REQUIRE(frames->size() == 2);
        registrations[*wire::rank_from_identity((*frames)[0])] = (*frames)[1];
      }
    }
    return registrations;
  }

  void call(std::uint64_t call_id, std::string_view method, std::string_view args_json) {
    auto args = wire::json_to_msgpack(args_json);
    REQUIRE(args);
    send(input, {identity, std::string(1, '\x03'),
                 wire::encode_utility_request(0, {call_id, false}, method, args->msgpack.view())});
  }

  std::optional<std::string> reply_frame(std::chrono::milliseconds timeout = kTimeout) {
    auto frames = receive(output, timeout);
    if (!frames) return std::nullopt;
    REQUIRE(frames->size() == 1);
    return frames->front();
  }

  wire::UtilityOutput reply(std::chrono::milliseconds timeout = kTimeout) {
    auto frame = reply_frame(timeout);
    REQUIRE(frame);
    auto outputs = wire::decode_engine_core_outputs(*frame);
    REQUIRE(outputs);
    REQUIRE(outputs->utility_output);
    return *outputs->utility_output;
  }
};

inline ReferenceEngineOptions options_for(const Frontend& frontend) {
  ReferenceEngineOptions options;
  options.handshake_address = frontend.handshake_address;
  options.init_timeout = 5s;
  return options;
}

inline std::string json(const std::string& msgpack) {
  auto text = wire::msgpack_to_json(msgpack);
  REQUIRE(text);
  return *text;
}

// Number of fields of an EngineCoreOutputs array.
inline std::uint32_t field_count(const std::string& frame) {
  auto handle = wire::decode(frame);
  REQUIRE(handle);
  REQUIRE(handle->get().type == msgpack::type::ARRAY);
  return handle->get().via.array.size;
}

inline bool wait_until_stopped(const ReferenceEngine& engine) {
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (engine.running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  return !engine.running();
}

// A frontend and one engine, started with options `configure` sets and taken through the
// handshake.
struct ConnectedEngine {
  Frontend frontend;
  std::unique_ptr<ReferenceEngine> engine;
  std::string registration;  // the frame the engine registered with

  template <typename Configure> explicit ConnectedEngine(Configure configure) {
    auto options = options_for(frontend);
    configure(options);
    engine = std::make_unique<ReferenceEngine>(options);
    engine->start();
    registration = frontend.connect(options.rank);
  }
};

}  // namespace vllmd::test
