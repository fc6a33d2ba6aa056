#include "cmd/vllmctl/output.hpp"

#include <unistd.h>

#include <cstdio>

namespace vllmd::vllmctl {

namespace {
// Whole lines, even when several servers' threads print at once.
void write_line(std::FILE* stream, std::string_view text) {
  ::flockfile(stream);
  std::fwrite(text.data(), 1, text.size(), stream);
  std::fputc('\n', stream);
  std::fflush(stream);
  ::funlockfile(stream);
}
}  // namespace

Output::Output(Format format, bool quiet, bool verbose)
    : format_(format), quiet_(quiet), verbose_(verbose),
      progress_(!quiet && ::isatty(STDERR_FILENO) == 1) {}

Output Output::labelled(std::string label) const {
  Output copy = *this;
  copy.label_ = std::move(label);
  copy.progress_ = false;  // several servers' uploads at once would share one line
  return copy;
}

Output Output::capturing(std::shared_ptr<Captured> into) const {
  Output copy = *this;
  copy.captured_ = std::move(into);
  return copy;
}

void Output::result(std::string_view text, std::string_view json) const {
  if (captured_) {
    captured_->results.emplace_back(json);
    return;
  }
  if (quiet_) return;
  if (format_ == Format::kJson) return write_line(stdout, json);
  write_line(stdout, label_.empty() ? std::string(text) : label_ + ": " + std::string(text));
}

void Output::error(std::string_view step, std::string_view message) const {
  if (captured_) captured_->errors.emplace_back(message);
  std::string line = "vllmctl: ";
  if (!label_.empty()) line.append(label_).append(": ");
  if (!step.empty()) line.append(step).append(": ");
  line.append(message);
  write_line(stderr, line);
}

void Output::note(std::string_view message) const {
  if (quiet_) return;
  write_line(stderr, "vllmctl: " + (label_.empty() ? "" : label_ + ": ") + std::string(message));
}

void Output::trace(std::string_view line) const {
  if (verbose_) write_line(stderr, "vllmctl: " + std::string(line));
}

void Output::progress(std::string_view label, std::size_t sent, std::size_t total) const {
  if (!progress_) return;
  const int percent = total == 0 ? 100 : static_cast<int>(sent * 100 / total);
  // \r rewrites the line in place; \033[K clears what a longer earlier line left behind.
  if (sent < total) {
    std::fprintf(stderr, "\rvllmctl: sending %.*s: %3d%% of %s\033[K",
                 static_cast<int>(label.size()), label.data(), percent, human_bytes(total).c_str());
  } else {
    std::fprintf(stderr, "\rvllmctl: sent %.*s (%s); waiting for the server\033[K",
                 static_cast<int>(label.size()), label.data(), human_bytes(total).c_str());
  }
  std::fflush(stderr);
}

void Output::end_progress() const {
  if (!progress_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
}

std::string human_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1000 && unit + 1 < std::size(kUnits)) {
    value /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, kUnits[unit]);
  return text;
}

}  // namespace vllmd::vllmctl
