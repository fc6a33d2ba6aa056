#pragma once
// What vllmctl prints. stdout carries data only: one line per step in text mode, the server's
// JSON body per call in json mode (newline-delimited), nothing with -q. Everything else
// (errors, -v traces, upload progress) goes to stderr. A command that runs on several servers
// labels each line with its server; one that sums up its calls in one document captures them.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vllmd::vllmctl {

enum class Format { kText, kJson };

// What a captured Output was given since the last take: the JSON bodies of results and the
// error messages, in order. One per thread of work; not shared between threads.
struct Captured {
  std::vector<std::string> results;  // json documents
  std::vector<std::string> errors;
};

class Output {
 public:
  Output(Format format, bool quiet, bool verbose);

  Format format() const { return format_; }
  bool quiet() const { return quiet_; }

  // The same output with every line labelled "<label>: " (a server, for commands on several).
  Output labelled(std::string label) const;
  // The same output, but results are kept in `into` instead of printed; errors are printed
  // and kept.
  Output capturing(std::shared_ptr<Captured> into) const;

  // One step's result: `text` in text mode, `json` in json mode.
  void result(std::string_view text, std::string_view json) const;
  // "vllmctl: <step>: <message>" on stderr, whatever -q says.
  void error(std::string_view step, std::string_view message) const;
  // error() for a failure (anything with a message and an exit code); its exit code.
  template <class Failure> int fail(std::string_view step, const Failure& failure) const {
    error(step, failure.message);
    return failure.exit_code;
  }
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
  std::string label_;
  std::shared_ptr<Captured> captured_;
};

// "88.1 MB"
std::string human_bytes(std::size_t bytes);

}  // namespace vllmd::vllmctl
