#include "cmd/vllmctl/context.hpp"

#include "cmd/vllmctl/reply.hpp"
#include "common/api/errors.hpp"

namespace vllmd::vllmctl {

int exit_code_for(const http::TransportError& error) {
  switch (error.kind) {
    case http::TransportErrorKind::kTimeout: return api::exit_code::kTimeout;
    case http::TransportErrorKind::kTls:
      return api::exit_code::kConfig;  // an untrusted certificate stays untrusted: --cacert
    case http::TransportErrorKind::kConnectFailed:
    case http::TransportErrorKind::kOther: return api::exit_code::kUnavailable;
  }
  return api::exit_code::kUnavailable;
}

tl::expected<http::Reply, Failure> Context::call(const Call& call) const {
  const api::Route& route = api::route_for(call.operation);
  http::Request request;
  request.method = route.method;
  request.path = route.path;
  request.query = call.query;
  request.body = call.body;
  request.retry = call.retry;
  request.session = session_;
  request.on_line = call.on_line;
  // Input files get a progress line: percent sent, then "waiting" while the engine works
  // (an NCCL update blocks until the broadcast is done).
  const bool progress = output_.shows_progress() && call.body && !call.progress_label.empty();
  if (progress) {
    request.progress = [this, &call](std::size_t sent, std::size_t total) {
      output_.progress(call.progress_label, sent, total);
    };
  }
  auto reply = client_.request(request);
  if (progress) output_.end_progress();
  if (!reply) {
    std::string message = reply.error().message;
    if (reply.error().kind == http::TransportErrorKind::kTimeout) message += " (--timeout)";
    if (reply.error().attempts > 1) {
      message += " (after " + std::to_string(reply.error().attempts) + " attempts)";
    }
    return tl::unexpected(Failure{exit_code_for(reply.error()), std::move(message), false});
  }
  const int code = api::exit_code_for(reply->status, error_code(*reply));
  if (code != api::exit_code::kOk) return tl::unexpected(Failure{code, error_text(*reply)});
  return std::move(*reply);
}

tl::expected<http::Reply, int> Context::call_or_report(std::string_view step,
                                                       const Call& call) const {
  auto reply = this->call(call);
  if (reply) return std::move(*reply);
  return tl::unexpected(output_.fail(step, reply.error()));
}

}  // namespace vllmd::vllmctl
