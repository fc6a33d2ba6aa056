#pragma once
// The poller's own parser for the simplest requests: a request line and a few headers, no
// body. Strict on purpose: whatever it does not accept goes to a worker and Poco's parser.

#include <optional>
#include <string_view>

#include "common/util/cidr.hpp"

namespace vllmd::daemon {

struct SimpleRequest {
  std::string_view method;
  std::string_view target;
  std::string_view authorization;  // the Authorization header, or empty
  std::optional<util::IpAddress> peer;  // filled in by the listener
  bool keep_alive = true;
};

// `header`: the request line and headers up to and including the blank line. nullopt for a
// body (Content-Length, Transfer-Encoding), Expect, folded or malformed lines, a repeated
// Authorization, an unknown Connection value, or a version other than HTTP/1.0 and 1.1.
std::optional<SimpleRequest> parse_simple_request(std::string_view header);

}  // namespace vllmd::daemon
