#include "common/http/client.hpp"

#include <Poco/Exception.h>
#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/SecureStreamSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/StreamCopier.h>
#include <Poco/URI.h>

#include <algorithm>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <thread>

#include "common/util/cidr.hpp"
#include "common/util/duration.hpp"

namespace vllmd::http {

namespace {

constexpr std::size_t kWriteSlice = 1 << 20;  // progress granularity for large bodies

Poco::Timespan timespan(std::chrono::milliseconds duration) {
  return Poco::Timespan(static_cast<Poco::Timespan::TimeDiff>(duration.count()) * 1000);
}

TransportError failure(TransportErrorKind kind, std::string message) {
  return TransportError{kind, std::move(message), 1};
}

// Connects by hand, so a failure here is known to have sent nothing (safe to retry), and sets
// the socket's timeouts: HTTPClientSession applies its own only to sockets it connects itself.
std::optional<TransportError> connect(Poco::Net::StreamSocket& socket, const Endpoint& endpoint,
                                      std::chrono::milliseconds timeout) {
  try {
    socket.connect(Poco::Net::SocketAddress(endpoint.host, endpoint.port), timespan(timeout));
    socket.setReceiveTimeout(timespan(timeout));
    socket.setSendTimeout(timespan(timeout));
  } catch (const Poco::TimeoutException&) {
    return failure(TransportErrorKind::kConnectFailed, "cannot connect to " + endpoint.url() +
                                                           ": no answer within " +
                                                           util::seconds_text(timeout));
  } catch (const Poco::Exception& error) {
    return failure(TransportErrorKind::kConnectFailed,
                   "cannot connect to " + endpoint.url() + ": " + error.displayText());
  }
  return std::nullopt;
}

// The TLS handshake over a connected socket: it checks the certificate chain and that it names
// endpoint.host.
std::optional<TransportError> start_tls(Poco::Net::StreamSocket& socket, const Endpoint& endpoint,
                                        const Poco::Net::Context::Ptr& tls,
                                        std::chrono::milliseconds timeout) {
  try {
    socket = Poco::Net::SecureStreamSocket::attach(socket, endpoint.host, tls);
  } catch (const Poco::TimeoutException&) {
    return failure(TransportErrorKind::kTimeout,
                   "no TLS handshake within " + util::seconds_text(timeout));
  } catch (const Poco::Exception& error) {
    return failure(TransportErrorKind::kTls,
                   "TLS with " + endpoint.url() + " failed: " + error.displayText());
  }
  return std::nullopt;
}

void set_headers(Poco::Net::HTTPRequest& http_request, const Endpoint& endpoint,
                 const ClientOptions& options, const Request& request) {
  http_request.setHost(endpoint.host, endpoint.port);
  http_request.setKeepAlive(false);
  http_request.set("Accept", "application/json");
  if (!options.token.empty()) http_request.set("Authorization", "Bearer " + options.token);
  if (!request.session.empty()) http_request.set("Vllmd-Session", std::string(request.session));
  if (request.body) {
    http_request.setContentType("application/json");
    http_request.setContentLength64(static_cast<Poco::Int64>(request.body->size()));
  }
}

// The body in slices, so the progress callback hears about a large one as it goes.
void send_body(std::ostream& out, const Request& request) {
  if (!request.body) return;
  const std::string_view body = *request.body;
  for (std::size_t at = 0; at < body.size();) {
    const std::size_t slice = std::min(kWriteSlice, body.size() - at);
    out.write(body.data() + at, static_cast<std::streamsize>(slice));
    at += slice;
    if (request.progress) request.progress(at, body.size());
  }
  out.flush();
}

// Sends the request and reads the whole reply; a failure says whether it came before or
// after the request was sent.
std::optional<TransportError> exchange(Poco::Net::HTTPClientSession& session,
                                       Poco::Net::HTTPRequest& http_request, const Request& request,
                                       Poco::Net::HTTPResponse& response, std::string& body,
                                       std::chrono::milliseconds timeout) {
  bool sent = false;
  try {
    std::ostream& out = session.sendRequest(http_request);
    out.exceptions(std::ios::badbit);  // let Poco's exception through instead of a bare badbit
    send_body(out, request);
    sent = true;
    std::istream& in = session.receiveResponse(response);
    const int status = static_cast<int>(response.getStatus());
    if (request.on_line && status >= 200 && status < 300) {
      // A stream can go quiet past the timeout, or break, after its head: Poco's exception
      // must come through, not end the lines as if the stream had ended.
      in.exceptions(std::ios::badbit);
      for (std::string line; std::getline(in, line);) request.on_line(line);
    } else {
      Poco::StreamCopier::copyToString(in, body);
    }
  } catch (const Poco::TimeoutException&) {
    return failure(TransportErrorKind::kTimeout,
                   std::string(sent ? "no reply" : "could not send the request") + " within " +
                       util::seconds_text(timeout));
  } catch (const Poco::Exception& error) {
    return failure(TransportErrorKind::kOther,
                   std::string(sent ? "reading the reply" : "sending the request") +
                       " failed: " + error.displayText());
  } catch (const std::exception& error) {
    return failure(TransportErrorKind::kOther, error.what());
  }
  return std::nullopt;
}

}  // namespace

std::string Endpoint::url() const {
  return scheme + "://" + util::join_host_port(host, std::to_string(port)) + base_path;
}

tl::expected<Endpoint, std::string> parse_endpoint(std::string_view url) {
  if (url.find("://") == std::string_view::npos) {
    return tl::unexpected("'" + std::string(url) + "' is not a URL; expected http://HOST[:PORT]");
  }
  Poco::URI uri;
  try {
    uri = Poco::URI(std::string(url));
  } catch (const Poco::Exception& error) {
    return tl::unexpected("'" + std::string(url) + "' is not a valid URL: " + error.message());
  }
  Endpoint endpoint;
  endpoint.scheme = uri.getScheme();
  if (endpoint.scheme != "http" && endpoint.scheme != "https") {
    return tl::unexpected("unsupported scheme '" + endpoint.scheme + "' in '" + std::string(url) +
                          "'; expected http://HOST[:PORT] or https://HOST[:PORT]");
  }
  endpoint.host = uri.getHost();
  if (endpoint.host.empty()) return tl::unexpected("no host in '" + std::string(url) + "'");
  if (!uri.getUserInfo().empty()) {
    return tl::unexpected(
        std::string("credentials in the URL are not supported; use a token file"));
  }
  if (!uri.getRawQuery().empty() || !uri.getFragment().empty()) {
    return tl::unexpected(std::string("the server URL must not have a query or fragment"));
  }
  endpoint.port = uri.getPort();  // the scheme's default when none (or 0) is given
  endpoint.base_path = uri.getPath();
  while (!endpoint.base_path.empty() && endpoint.base_path.back() == '/') {
    endpoint.base_path.pop_back();
  }
  return endpoint;
}

std::string_view kind_name(TransportErrorKind kind) {
  switch (kind) {
    case TransportErrorKind::kConnectFailed: return "connect_failed";
    case TransportErrorKind::kTimeout: return "timeout";
    case TransportErrorKind::kTls: return "tls";
    case TransportErrorKind::kOther: return "other";
  }
  return "other";
}

Client::Client(Endpoint endpoint, ClientOptions options)
    : endpoint_(std::move(endpoint)), options_(std::move(options)) {
  if (endpoint_.scheme != "https") return;
  Poco::Net::Context::Params params;
  params.caLocation = options_.ca_file;
  params.loadDefaultCAs = options_.verify_peer && options_.ca_file.empty();
  // STRICT: RELAXED would skip the host-name check for loopback addresses.
  params.verificationMode =
      options_.verify_peer ? Poco::Net::Context::VERIFY_STRICT : Poco::Net::Context::VERIFY_NONE;
  try {
    tls_ = new Poco::Net::Context(Poco::Net::Context::TLS_CLIENT_USE, params);
    tls_->disableProtocols(Poco::Net::Context::PROTO_SSLV2 | Poco::Net::Context::PROTO_SSLV3 |
                           Poco::Net::Context::PROTO_TLSV1 | Poco::Net::Context::PROTO_TLSV1_1);
  } catch (const Poco::Exception& error) {
    throw std::runtime_error("cannot load the CA file '" + options_.ca_file +
                             "': " + error.displayText());
  }
}

Client::~Client() = default;
Client::Client(Client&&) noexcept = default;
Client::Client(const Client&) = default;

void Client::trace(const std::string& line) const {
  if (options_.trace) options_.trace(line);
}

std::string Client::target(const Request& request) const {
  std::string target = endpoint_.base_path + std::string(request.path);
  char separator = '?';
  for (const auto& [key, value] : request.query) {
    target += separator;
    Poco::URI::encode(key, "&=+?#", target);
    target += '=';
    Poco::URI::encode(value, "&=+?#", target);
    separator = '&';
  }
  return target;
}

tl::expected<Reply, TransportError> Client::request(const Request& request) const {
  const bool idempotent = request.method == "GET";
  const int attempts = idempotent && request.retry ? 1 + std::max(0, options_.retry.retries) : 1;
  std::chrono::milliseconds delay = options_.retry.first_delay;
  for (int attempt_number = 1;; ++attempt_number) {
    auto result = attempt(request);
    const bool retryable =
        result ? result->status == 503 : result.error().kind == TransportErrorKind::kConnectFailed;
    if (!retryable || attempt_number >= attempts) {
      if (!result) result.error().attempts = attempt_number;
      return result;
    }
    trace("retrying in " + util::seconds_text(delay) + " (attempt " +
          std::to_string(attempt_number) + " of " + std::to_string(attempts) + " failed)");
    std::this_thread::sleep_for(delay);
    delay *= 2;
  }
}

tl::expected<Reply, TransportError> Client::attempt(const Request& request) const {
  const std::string path = target(request);
  const auto started = std::chrono::steady_clock::now();
  trace("> " + std::string(request.method) + " " + endpoint_.url() +
        path.substr(endpoint_.base_path.size()) +
        (request.body ? " (" + std::to_string(request.body->size()) + " bytes)" : ""));

  Poco::Net::StreamSocket socket;
  if (auto error = connect(socket, endpoint_, options_.timeout)) return tl::unexpected(*error);
  if (tls_) {
    if (auto error = start_tls(socket, endpoint_, tls_, options_.timeout)) {
      return tl::unexpected(*error);
    }
  }
  Poco::Net::HTTPClientSession session(socket);
  session.setTimeout(timespan(options_.timeout));
  session.setKeepAlive(false);
  Poco::Net::HTTPRequest http_request(std::string(request.method), path,
                                      Poco::Net::HTTPMessage::HTTP_1_1);
  set_headers(http_request, endpoint_, options_, request);

  Poco::Net::HTTPResponse response;
  Reply reply;
  if (auto error =
          exchange(session, http_request, request, response, reply.body, options_.timeout)) {
    return tl::unexpected(*error);
  }
  reply.status = static_cast<int>(response.getStatus());
  const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - started);
  trace("< " + std::to_string(reply.status) + " " + response.getReason() + " (" +
        std::to_string(reply.body.size()) + " bytes, " + std::to_string(elapsed.count()) + " ms)");
  return reply;
}

}  // namespace vllmd::http
