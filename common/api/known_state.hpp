#pragma once
// What each engine last told vllmd about its weight version and pause state. An engine runs
// utility calls one at a time, so a query sent while an NCCL update blocks it would wait for
// the update; read-only routes answer from here instead while engine calls are in flight.
//
// A newly admitted engine is a new process (a vLLM engine says HELLO once in its life), so
// it starts at version "default", not paused: that is what it is seeded with on admission.

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

  // The version all engines hold, or the disagreement.
  tl::expected<std::string, std::string> version() const;
  bool paused() const;  // any engine paused

 private:
  struct Known {
    std::uint64_t admissions = 0;
    std::string version = "default";
    bool paused = false;
  };
  mutable std::mutex mutex_;
  std::vector<Known> engines_;
};

}  // namespace vllmd::api
