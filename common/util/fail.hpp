#pragma once
// The error side of a tl::expected<T, std::string>, for `return fail("what went wrong");`.

#include <string>
#include <tl/expected.hpp>
#include <utility>

namespace vllmd::util {

// Takes anything a std::string is made from: a literal, a string (moved), a string_view.
template <typename Text> tl::unexpected<std::string> fail(Text&& message) {
  return tl::unexpected(std::string(std::forward<Text>(message)));
}

}  // namespace vllmd::util
