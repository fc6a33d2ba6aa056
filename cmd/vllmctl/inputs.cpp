#include "cmd/vllmctl/inputs.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/api/errors.hpp"
#include "common/api/request.hpp"
#include "common/util/errno_text.hpp"
#include "common/wire/json_to_msgpack.hpp"

namespace vllmd::vllmctl {

namespace {

namespace exit_code = api::exit_code;

tl::unexpected<InputError> fail(int code, std::string message) {
  return tl::unexpected(InputError{code, std::move(message)});
}

// Appends everything readable from `fd` to `out`.
bool read_all(int fd, std::string& out) {
  char slice[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, slice, sizeof slice);
    if (got == 0) return true;
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    out.append(slice, static_cast<std::size_t>(got));
  }
}

tl::expected<std::string, InputError> read_wrapped(const std::string& path, std::string_view key) {
  std::string body = "{\"" + std::string(key) + "\":";
  if (path == "-") {
    if (::isatty(STDIN_FILENO) == 1) {
      return fail(exit_code::kUsage, "refusing to read " + std::string(key) +
                                         " from a terminal; pipe it in (... --info - < FILE) "
                                         "or pass the file name");
    }
    if (!read_all(STDIN_FILENO, body)) {
      return fail(exit_code::kNoInput, "cannot read stdin: " + util::errno_text(errno));
    }
  } else {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return fail(exit_code::kNoInput, "cannot open " + path + ": " + util::errno_text(errno));
    }
    struct stat info {};
    if (::fstat(fd, &info) == 0 && S_ISREG(info.st_mode)) {
      body.reserve(body.size() + static_cast<std::size_t>(info.st_size) + 1);
    }
    const bool read = read_all(fd, body);
    const int read_errno = errno;
    ::close(fd);
    if (!read) {
      return fail(exit_code::kNoInput, "cannot read " + path + ": " + util::errno_text(read_errno));
    }
  }
  body += '}';
  return body;
}

// True when the input starts with {"<key>": — the whole request body instead of the value.
bool starts_with_own_key(std::string_view input, std::string_view key) {
  std::size_t at = input.find_first_not_of(" \t\r\n");
  if (at == std::string_view::npos || input[at] != '{') return false;
  at = input.find_first_not_of(" \t\r\n", at + 1);
  const std::string quoted = "\"" + std::string(key) + "\"";
  return at != std::string_view::npos && input.substr(at, quoted.size()) == quoted;
}

tl::expected<void, InputError> validate(std::string_view body, const api::Route& route,
                                        const std::string& label) {
  const std::string_view key = route.member;
  const std::size_t prefix = key.size() + 4;  // {"key":
  const std::string_view input = body.substr(prefix, body.size() - prefix - 1);
  // One pass over the wrapped body checks both the JSON and the server's shape rule. It has
  // exactly one member only when the input is exactly one JSON value (our '}' must close it).
  auto wrapped = wire::json_to_msgpack(body);
  if (!wrapped || wrapped->members.size() != 1) {
    auto alone = wire::json_to_msgpack(input);  // error path only: offsets within the input
    return fail(exit_code::kRejected,
                label + ": invalid JSON: " +
                    (alone ? "more than one JSON value" : alone.error().describe()));
  }
  auto value = api::member_value(route, *wrapped);
  if (!value) {
    return fail(exit_code::kRejected,
                label + ": " + value.error().message + " (param: " + std::string(key) + ")");
  }
  if (starts_with_own_key(input, key)) {
    return fail(exit_code::kRejected, label + ": holds {\"" + std::string(key) +
                                          "\": ...}; the file must hold the " + std::string(key) +
                                          " value itself (param: " + std::string(key) + ")");
  }
  return {};
}

}  // namespace

InfoInput::InfoInput(std::string path, const api::Route& route)
    : path_(std::move(path)), label_(path_ == "-" ? "stdin" : path_), route_(&route) {}

tl::expected<void, InputError> InfoInput::check(bool keep) {
  auto body = read_wrapped(path_, route_->member);
  if (!body) return tl::unexpected(body.error());
  if (auto valid = validate(*body, *route_, label_); !valid) return valid;
  if (keep || path_ == "-") body_ = std::move(*body);
  return {};
}

tl::expected<std::string, InputError> InfoInput::take_body() {
  if (body_) {
    std::string body = std::move(*body_);
    body_.reset();
    return body;
  }
  // Checked before; the server validates again should the file have changed since.
  return read_wrapped(path_, route_->member);
}

tl::expected<void, InputError> check_inputs(std::vector<InfoInput>& inputs) {
  int from_stdin = 0;
  for (const InfoInput& input : inputs) from_stdin += input.path() == "-" ? 1 : 0;
  if (from_stdin > 1) return fail(exit_code::kUsage, "stdin ('-') can be read only once");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (auto checked = inputs[i].check(i == 0); !checked) return checked;
  }
  return {};
}

}  // namespace vllmd::vllmctl
