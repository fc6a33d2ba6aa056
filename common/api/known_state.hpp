#pragma once
// What each engine last told vllmd about its weight version and pause state. Only calls
// vllmd itself makes change them, so while no such call is under way or has failed, this is
// what the engines would answer: read-only routes answer from here without a round trip
// (and while engine calls are in flight, from here in any case: an engine runs utility calls
// one at a time, so a query would wait behind a blocked NCCL update).
//
// A newly admitted engine is a new process (a vLLM engine says HELLO once in its life), so
// it starts at version "default", not paused: that is what it is seeded with on admission.
// A call that may change a value makes it uncertain until the call succeeds or an engine
// reports the value again.

#include <cstdint>
#include <mutex>
#include <string>
#include <tl/expected.hpp>
#include <vector>

#include "common/engine/client.hpp"

namespace vllmd::api {

class KnownState {
 public:
  // Seeds the engines admitted since the last call; call with a fresh engines() snapshot.
  void sync(const std::vector<engine::EngineStatus>& engines);

  void set_version(int rank, const std::string& version);
  void set_version_all(const std::string& version);
  void set_paused_all(bool paused);
  void set_paused(int rank, bool paused);
  void forget_version();  // a call that may change it is under way (or failed)
  void forget_paused();
  bool version_certain() const;  // every engine's version is known for sure
  bool paused_certain() const;

  // The version all engines hold, or the disagreement.
  tl::expected<std::string, std::string> version() const;
  bool paused() const;  // any engine paused

 private:
  struct Known {
    std::uint64_t admissions = 0;
    std::string version = "default";
    bool paused = false;
    bool version_known = true;
    bool paused_known = true;
  };
  mutable std::mutex mutex_;
  std::vector<Known> engines_;
};

}  // namespace vllmd::api
