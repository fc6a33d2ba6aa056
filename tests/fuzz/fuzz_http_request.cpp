// Fuzz target: the poller's own parser for simple requests (network input, on the thread
// that owns every idle connection). Whatever it returns must point into the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "daemon/simple_request.hpp"

namespace {

bool inside(std::string_view part, std::string_view whole) {
  return part.empty() || (part.data() >= whole.data() &&
                          part.data() + part.size() <= whole.data() + whole.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view header(reinterpret_cast<const char*>(data), size);
  const auto request = vllmd::daemon::parse_simple_request(header);
  if (request && (request->method.empty() || request->target.empty() ||
                  !inside(request->method, header) || !inside(request->target, header) ||
                  !inside(request->authorization, header))) {
    std::abort();
  }
  return 0;
}
