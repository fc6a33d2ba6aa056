#pragma once
// What vllmctl prints. stdout carries data only: one line per step in text mode, the server's
// JSON body per call in json mode (newline-delimited), nothing with -q. Everything else
// (errors, -v traces, upload progress) goes to stderr.

#include <cstddef>
#include <string>
#include <string_view>

namespace vllmd::vllmctl {

enum class Format { kText, kJson };

class Output {
 public:
  Output(Format format, bool quiet, bool verbose);

  Format format() const { return format_; }
  bool quiet() const { return quiet_; }

  // One step's result: `text` in text mode, `json` in json mode.
  void result(std::string_view text, std::string_view json) const;
  // "vllmctl: <step>: <message>" on stderr, whatever -q says.
  void error(std::string_view step, std::string_view message) const;
  // A diagnostic line on stderr ("vllmctl: ..."), suppressed by -q.
  void note(std::string_view message) const;
  // A -v line on stderr.
  void trace(std::string_view line) const;

  // Upload progress on stderr, only when stderr is a terminal and not -q.
  bool shows_progress() const { return progress_; }
  void progress(std::string_view label, std::size_t sent, std::size_t total) const;
  void end_progress() const;

 private:
  Format format_;
  bool quiet_;
  bool verbose_;
  bool progress_;
};

// "88.1 MB"
std::string human_bytes(std::size_t bytes);

}  // namespace vllmd::vllmctl
