#include "cmd/vllmctl/output.hpp"

#include <unistd.h>

#include <cstdio>

namespace vllmd::vllmctl {

namespace {
void write_line(std::FILE* stream, std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stream);
  std::fputc('\n', stream);
  std::fflush(stream);
}
}  // namespace

Output::Output(Format format, bool quiet, bool verbose)
    : format_(format), quiet_(quiet), verbose_(verbose),
      progress_(!quiet && ::isatty(STDERR_FILENO) == 1) {}

void Output::result(std::string_view text, std::string_view json) const {
  if (quiet_) return;
  write_line(stdout, format_ == Format::kJson ? json : text);
}

void Output::error(std::string_view step, std::string_view message) const {
  std::string line = "vllmctl: ";
  if (!step.empty()) line.append(step).append(": ");
  line.append(message);
  write_line(stderr, line);
}

void Output::note(std::string_view message) const {
  if (quiet_) return;
  write_line(stderr, "vllmctl: " + std::string(message));
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
