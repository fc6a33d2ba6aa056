#pragma once
// The JSON inputs of `weights init/update/sync`: files (or "-" for stdin) holding the
// init_info / update_info value itself. Each is checked locally with the same rules the
// server applies, then sent as {"init_info": <the file's bytes>} without re-serializing it.

#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "common/api/table.hpp"

namespace vllmd::vllmctl {

struct InputError {
  int exit_code = 0;  // 64 (terminal stdin), 65 (bad JSON or shape), 66 (missing, unreadable)
  std::string message;
};

class InfoInput {
 public:
  // The input of `route`'s body member (Route::member, checked as Route::member_kind).
  InfoInput(std::string path, const api::Route& route);

  const std::string& path() const { return path_; }
  const std::string& label() const { return label_; }  // the path as given, "stdin" for "-"

  // Reads and validates the input. The body is kept when `keep`, and always for stdin,
  // which cannot be read twice; otherwise it is read again when sent (files reach ~90 MB).
  tl::expected<void, InputError> check(bool keep);
  // The request body {"<key>":<bytes>}: the kept one, or the file read again.
  tl::expected<std::string, InputError> take_body();

 private:
  std::string path_;
  std::string label_;
  const api::Route* route_;
  std::optional<std::string> body_;
};

// Checks every input before the first call, so a bad file never leaves a half-done session
// (or paused generation) behind. Only the first body and stdin stay in memory.
tl::expected<void, InputError> check_inputs(std::vector<InfoInput>& inputs);

}  // namespace vllmd::vllmctl
