#pragma once
// What each engine last told vllmd about its weight version and pause state. Only calls
// vllmd itself makes change them, so while no such call is under way or has failed, this is
// what the engines would answer: read-only routes answer from here without a round trip
// (and while engine calls are in flight, from here in any case: an engine runs utility calls
// one at a time, so a query would wait behind a blocked NCCL update).
//
// Every write carries the sequence number of the call it came from, taken when that call was
// sent: an engine answers calls in the order they were sent, so a call sent later saw a
// newer state, and an answer to an older call (a read that raced a newer set) is dropped.
// A call that may change a value makes it uncertain until a write at least as new arrives.
//
// A newly admitted engine is a new process (a vLLM engine says HELLO once in its life), so
// it starts at version "default", not paused: that is what it is seeded with on admission.

#include <cstdint>
#include <mutex>
#include <string>
#include <tl/expected.hpp>
#include <vector>

#include "common/engine/engine_calls.hpp"

namespace vllmd::api {

class KnownState {
 public:
  // A number for a call about to be sent; later calls get larger numbers.
  std::uint64_t next_sequence();
  // Seeds the engines admitted since the last call; call with a fresh engines() snapshot.
  void sync(const std::vector<engine::EngineStatus>& engines);

  // A call sent at `sequence` may change the value: uncertain until something as new is known.
  void changing_version(std::uint64_t sequence);
  void changing_paused(std::uint64_t sequence);
  // What a call sent at `sequence` established: a successful set, or what a read returned.
  void set_version(int rank, std::uint64_t sequence, const std::string& version);
  void set_version_all(std::uint64_t sequence, const std::string& version);
  void set_paused(int rank, std::uint64_t sequence, bool paused);
  void set_paused_all(std::uint64_t sequence, bool paused);

  bool version_certain() const;  // every engine's version is known for sure
  bool paused_certain() const;
  // The version all engines hold, or the disagreement.
  tl::expected<std::string, std::string> version() const;
  bool paused() const;  // any engine paused

 private:
  template <typename T> struct Known {
    T value{};
    std::uint64_t written = 0;   // sequence of the call the value came from
    std::uint64_t changing = 0;  // sequence of the newest call that may have changed it
    bool certain() const { return changing <= written; }
    void write(std::uint64_t sequence, const T& next) {
      if (sequence < written) return;  // an answer to an older call: a newer one is known
      value = next;
      written = sequence;
    }
  };
  struct Engine {
    std::uint64_t incarnation = 0;
    Known<std::string> version;
    Known<bool> paused;
  };

  mutable std::mutex mutex_;
  std::uint64_t sequence_ = 0;
  std::vector<Engine> engines_;
};

}  // namespace vllmd::api
