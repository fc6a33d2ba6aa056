#pragma once
// What every server command works with: the HTTP client, the output, and `call`, which runs
// one route from the API table and turns any failure into an exit code and a message.

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>

#include "cmd/vllmctl/output.hpp"
#include "common/api/request.hpp"
#include "common/api/table.hpp"
#include "common/http/client.hpp"

namespace vllmd::vllmctl {

struct Failure {
  int exit_code = 0;
  std::string message;  // the server's message (param: X), or what went wrong on the way
  bool replied = true;  // false: no HTTP reply at all (unreachable, timeout, reset)
};

struct Call {
  api::Operation operation;
  api::Query query = {};
  std::optional<std::string_view> body = std::nullopt;      // nullopt: no body, no Content-Type
  std::string progress_label = {};                          // shown while a large body is sent
  bool retry = true;                                        // GETs only; see http::Client::request
  std::function<void(std::string_view line)> on_line = {};  // a stream's lines, as they come
};

class Context {
 public:
  Context(http::Client client, Output output)
      : client_(std::move(client)), output_(std::move(output)) {}

  const Output& out() const { return output_; }
  const http::Endpoint& endpoint() const { return client_.endpoint(); }
  // The weight-update session every call names (Vllmd-Session), or empty.
  const std::string& session() const { return session_; }
  Context with_session(std::string session) const {
    Context copy = *this;
    copy.session_ = std::move(session);
    return copy;
  }
  Context with_output(Output output) const {
    Context copy = *this;
    copy.output_ = std::move(output);
    return copy;
  }

  // Sends the route's method and path (from api::kRoutes). A 2xx reply is a value; any
  // other status, and any transport error, is a Failure with its exit code (docs/product.md §4.5).
  tl::expected<http::Reply, Failure> call(const Call& call) const;
  // call(), with a failure reported under `step`: the reply, or the exit code to return.
  tl::expected<http::Reply, int> call_or_report(std::string_view step, const Call& call) const;

 private:
  http::Client client_;
  Output output_;
  std::string session_;
};

// The exit code for a transport error: 69 when the daemon is unreachable, 75 on timeout.
int exit_code_for(const http::TransportError& error);

}  // namespace vllmd::vllmctl
