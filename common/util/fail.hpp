#pragma once
// The error side of a tl::expected<T, std::string>, for `return fail("what went wrong");`.

#include <string>
#include <tl/expected.hpp>
#include <utility>

namespace vllmd::util {

inline tl::unexpected<std::string> fail(std::string message) {
  return tl::unexpected(std::move(message));
}

}  // namespace vllmd::util
