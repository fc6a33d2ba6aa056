#include "daemon/http_listener.hpp"

#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPServerRequestImpl.h>
#include <Poco/Net/HTTPServerResponseImpl.h>
#include <Poco/Net/HTTPServerSession.h>
#include <Poco/Net/NetException.h>
#include <Poco/Net/SecureStreamSocket.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/Net/StreamSocketImpl.h>
#include <Poco/Timestamp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util/log.hpp"

namespace vllmd::daemon {

namespace {

using Poco::Net::HTTPResponse;

Poco::Timespan timespan(double seconds) {
  return Poco::Timespan(static_cast<Poco::Timespan::TimeDiff>(seconds * 1e6));
}

// A short JSON error written straight to a socket nobody else reads (best effort: the
// connection is closed right after).
void send_error(int fd, int status, std::string_view reason, std::string_view message) {
  const std::string body = std::string(R"({"error":{"message":")") + std::string(message) +
                           R"(","type":"server_error","param":null,"code":")" +
                           std::to_string(status) + "\"}}";
  const std::string response = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) +
                               "\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                               body;
  [[maybe_unused]] const ssize_t sent =
      ::send(fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

Poco::AutoPtr<Poco::Net::Context> tls_context(const ListenerOptions& options) {
  if (options.tls_cert_file.empty()) return nullptr;
  Poco::Net::Context::Params params;
  params.certificateFile = options.tls_cert_file;
  // Without a key file the certificate file holds the key too (one PEM bundle).
  params.privateKeyFile =
      options.tls_key_file.empty() ? options.tls_cert_file : options.tls_key_file;
  params.verificationMode = Poco::Net::Context::VERIFY_NONE;  // clients authenticate by key
  params.loadDefaultCAs = false;
  params.cipherList = "HIGH:!aNULL:!eNULL:!MD5:!RC4:!3DES";
  Poco::AutoPtr<Poco::Net::Context> context(
      new Poco::Net::Context(Poco::Net::Context::TLS_SERVER_USE, params));
  context->disableProtocols(Poco::Net::Context::PROTO_SSLV2 | Poco::Net::Context::PROTO_SSLV3 |
                            Poco::Net::Context::PROTO_TLSV1 | Poco::Net::Context::PROTO_TLSV1_1);
  return context;
}

int fd_of(const Poco::Net::Socket& socket) { return socket.impl()->sockfd(); }

// Where a request's header ends (its blank line), or npos while it is incomplete.
std::size_t header_end(std::string_view bytes) { return bytes.find("\r\n\r\n"); }

std::optional<util::IpAddress> peer_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    return util::IpAddress::from_bytes(&v4.sin_addr, 4);
  }
  if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    return util::IpAddress::from_bytes(&v6.sin6_addr, 16);
  }
  return std::nullopt;
}


void signal(int event_fd) {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = ::write(event_fd, &one, sizeof one);
}

void drain(int event_fd) {
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t got = ::read(event_fd, &count, sizeof count);
}

}  // namespace

struct HttpListener::Connection {
  Poco::Net::StreamSocket socket;
  int fd = -1;
  std::unique_ptr<Session> session;  // made by the first worker, kept for read-ahead bytes
  Clock::time_point waiting_since;   // parked at
  bool header_started = false;       // some bytes of the next request have arrived
  bool header_too_large = false;
  std::optional<util::IpAddress> peer;  // from accept
};

HttpListener::HttpListener(const ListenerOptions& options,
                           Poco::Net::HTTPRequestHandlerFactory::Ptr factory)
    : options_(options), factory_(std::move(factory)), tls_(tls_context(options)) {
  params_ = new Poco::Net::HTTPServerParams;
  params_->setTimeout(timespan(options.timeout));
  params_->setKeepAlive(true);
  params_->setKeepAliveTimeout(timespan(options.keep_alive_timeout));
  params_->setMaxKeepAliveRequests(0);
  params_->setServerName("vllmd");
  listen_socket_.bind(
      Poco::Net::SocketAddress(options.host, static_cast<Poco::UInt16>(options.port)), true);
  listen_socket_.listen(std::clamp(options.max_connections, 64, 4096));
  listen_socket_.setBlocking(false);
  port_ = listen_socket_.address().port();
  peek_buffer_.resize(static_cast<std::size_t>(options.max_header_bytes) + 1);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  need_worker_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0 || need_worker_fd_ < 0) throw std::runtime_error("epoll: " + std::string(std::strerror(errno)));
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake);
  watch_listener();
}

void HttpListener::watch_listener() {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = fd_of(listen_socket_);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event.data.fd, &event);
}

HttpListener::~HttpListener() {
  abort();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (need_worker_fd_ >= 0) ::close(need_worker_fd_);
}

void HttpListener::start() {
  poller_ = std::thread([this] { poll_loop(); });
  for (int i = 0; i < options_.threads; ++i) workers_.emplace_back([this] { work_loop(); });
}

void HttpListener::wake() const { signal(wake_fd_); }

void HttpListener::stop_accepting() {
  accepting_ = false;
  wake();
}

bool HttpListener::wait_idle(double seconds) const {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<long>(seconds * 1000));
  while (stats().current > 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void HttpListener::abort() {
  accepting_ = false;
  stopping_ = true;
  {
    std::lock_guard lock(mutex_);
    // A worker blocked reading a slow client's body returns at once.
    for (Connection* connection : serving_) ::shutdown(connection->fd, SHUT_RDWR);
    queue_.clear();
  }
  work_ready_.notify_all();
  wake();
  if (poller_.joinable()) poller_.join();
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
  close_parked();
}

ConnectionStats HttpListener::stats() const {
  std::lock_guard lock(mutex_);
  ConnectionStats stats;
  stats.busy = static_cast<int>(serving_.size());
  stats.queued = static_cast<int>(queue_.size());
  stats.current = static_cast<int>(parked_.size()) + stats.busy + stats.queued;
  stats.refused = refused_;
  stats.total = total_;
  return stats;
}

// ---------------------------------------------------------------------------------------------
// The poller

void HttpListener::poll_loop() {
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  while (!stopping_) {
    const int ready = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 250);
    if (!accepting_ && listening_) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd_of(listen_socket_), nullptr);
      listen_socket_.close();
      listening_ = false;
      close_parked();  // idle keep-alive connections end with the listener
    }
    for (int i = 0; i < ready && !stopping_; ++i) {
      const int fd = events[static_cast<std::size_t>(i)].data.fd;
      if (fd == wake_fd_) {
        drain(wake_fd_);
      } else if (listening_ && fd == fd_of(listen_socket_)) {
        accept_all();
      } else {
        on_readable(fd);
      }
    }
    const auto now = Clock::now();
    if (now - last_sweep >= std::chrono::milliseconds(250)) {
      if (accept_paused_ && listening_) {
        accept_paused_ = false;
        watch_listener();
      }
      sweep_idle(now);
      last_sweep = now;
    }
  }
}

void HttpListener::accept_all() {
  for (;;) {
    sockaddr_storage address{};
    socklen_t address_length = sizeof address;
    const int fd = ::accept4(fd_of(listen_socket_), reinterpret_cast<sockaddr*>(&address),
                             &address_length, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors (EMFILE/ENFILE): the backlog stays readable, so stop watching it
        // for a moment instead of spinning; the sweep re-arms it.
        log::warning("accept: ", std::strerror(errno), "; pausing new connections briefly");
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd_of(listen_socket_), nullptr);
        accept_paused_ = true;
      }
      return;
    }
    Poco::Net::StreamSocket socket(new Poco::Net::StreamSocketImpl(fd));
    ++total_;
    if (stats().current >= options_.max_connections) {
      ++refused_;
      send_error(fd, 503, "Service Unavailable", "too many connections (server.max_connections)");
      continue;  // closed as `socket` goes
    }
    socket.setNoDelay(true);
    socket.setReceiveTimeout(timespan(options_.timeout));
    socket.setSendTimeout(timespan(options_.timeout));
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    connection->socket = std::move(socket);
    connection->peer = peer_of(address);
    park(std::move(connection));
  }
}

void HttpListener::park(std::unique_ptr<Connection> connection) {
  connection->waiting_since = Clock::now();
  connection->header_started = false;
  const int fd = connection->fd;
  {
    std::lock_guard lock(mutex_);
    parked_[fd] = std::move(connection);
  }
  // Edge-triggered: a partial header re-arms nothing and cannot spin; adding a descriptor
  // that already has bytes reports them once.
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  event.data.fd = fd;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
}

void HttpListener::on_readable(int fd) {
  // Pipelined requests answered in place leave the next one in the socket, and an
  // edge-triggered epoll will not report bytes that were already there.
  while (handle_readable(fd)) {
  }
}

// Looks at what a parked connection received; whether to look again.
bool HttpListener::handle_readable(int fd) {
  std::unique_lock lock(mutex_);
  const auto found = parked_.find(fd);
  if (found == parked_.end()) return false;  // already handed to a worker
  Connection& connection = *found->second;
  bool complete = true;
  std::string_view header;  // complete, for the simple-request path
  if (!tls_) {
    // The header is left in the socket for Poco; only its end is looked for.
    const ssize_t peeked =
        ::recv(fd, peek_buffer_.data(), peek_buffer_.size(), MSG_PEEK | MSG_DONTWAIT);
    if (peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (peeked <= 0) {  // the peer closed or the connection failed
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      parked_.erase(found);
      return false;
    }
    const std::string_view bytes(peek_buffer_.data(), static_cast<std::size_t>(peeked));
    const auto limit = static_cast<std::size_t>(options_.max_header_bytes);
    const std::size_t end = header_end(bytes);  // a body may follow it in the peek
    connection.header_too_large = end == std::string_view::npos ? bytes.size() > limit
                                                                : end + 4 > limit;
    complete = connection.header_too_large || end != std::string_view::npos;
    if (complete && !connection.header_too_large && accepting_) {
      header = bytes.substr(0, end + 4);
    }
    if (!complete && !connection.header_started) {
      connection.header_started = true;
      connection.waiting_since = Clock::now();  // from now on `timeout` applies
    }
  }
  if (!complete) return false;
  if (!header.empty()) {
    // The poller alone touches parked connections: the entry stays valid unlocked.
    lock.unlock();
    const Served served = serve_simple(connection, header);
    if (served == Served::kParked) {
      int pending = 0;
      return ::ioctl(fd, FIONREAD, &pending) == 0 && pending > 0;
    }
    lock.lock();
    if (served == Served::kClosed) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      parked_.erase(fd);
      return false;
    }
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  const auto entry = parked_.find(fd);
  std::unique_ptr<Connection> ready = std::move(entry->second);
  parked_.erase(entry);
  lock.unlock();
  dispatch(std::move(ready));
  return false;
}

// A simple request answered in place: parsed here, answered by options_.answer_simple, its
// bytes consumed and the response written with one send. Only with an empty send queue, so
// the response leaves whole at once (a client that does not read its answers goes to a
// worker), and only when nothing was read ahead into a Poco session.
HttpListener::Served HttpListener::serve_simple(Connection& connection, std::string_view header) {
  if (!options_.answer_simple) return Served::kNo;
  if (connection.session && connection.session->has_buffered_input()) return Served::kNo;
  int unsent = 0;
  if (::ioctl(connection.fd, SIOCOUTQ, &unsent) != 0 || unsent != 0) return Served::kNo;
  std::optional<SimpleRequest> request = parse_simple_request(header);
  if (!request) return Served::kNo;
  request->peer = connection.peer;
  request->keep_alive = request->keep_alive && accepting_;
  const std::optional<std::string> response = options_.answer_simple(*request);
  if (!response) return Served::kNo;
  // `header` is in the peek buffer; the same bytes are still in the socket: drop them.
  thread_local std::vector<char> sink;
  sink.resize(header.size());
  if (::recv(connection.fd, sink.data(), sink.size(), MSG_DONTWAIT) !=
      static_cast<ssize_t>(sink.size())) {
    return Served::kClosed;
  }
  const ssize_t sent =
      ::send(connection.fd, response->data(), response->size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (sent != static_cast<ssize_t>(response->size()) || !request->keep_alive) {
    return Served::kClosed;
  }
  connection.waiting_since = Clock::now();
  connection.header_started = false;
  return Served::kParked;
}

void HttpListener::dispatch(std::unique_ptr<Connection> connection) {
  {
    std::lock_guard lock(mutex_);
    if (static_cast<int>(queue_.size()) < options_.max_queued) {
      queue_.push_back(std::move(connection));
      work_ready_.notify_one();
      if (idle_workers_ == 0) signal(need_worker_fd_);  // lingering workers: come back
      return;
    }
  }
  ++refused_;
  send_error(connection->fd, 503, "Service Unavailable",
             "too many requests waiting (server.max_queued)");
}

void HttpListener::sweep_idle(Clock::time_point now) {
  const auto idle_limit = timespan(options_.keep_alive_timeout);
  const auto stall_limit = timespan(options_.timeout);
  std::vector<std::unique_ptr<Connection>> expired;
  {
    std::lock_guard lock(mutex_);
    for (auto it = parked_.begin(); it != parked_.end();) {
      Connection& connection = *it->second;
      const auto limit = connection.header_started ? stall_limit : idle_limit;
      const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(
          now - connection.waiting_since);
      if (waited.count() < limit.totalMicroseconds()) {
        ++it;
        continue;
      }
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->first, nullptr);
      if (connection.header_started) {
        send_error(it->first, 408, "Request Timeout", "request header not received in time");
      }
      expired.push_back(std::move(it->second));
      it = parked_.erase(it);
    }
  }
}

void HttpListener::close_parked() {
  std::map<int, std::unique_ptr<Connection>> parked;
  {
    std::lock_guard lock(mutex_);
    parked.swap(parked_);
  }
  for (const auto& [fd, connection] : parked) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
}

// ---------------------------------------------------------------------------------------------
// The workers

void HttpListener::work_loop() {
  for (;;) {
    std::unique_ptr<Connection> connection;
    {
      std::unique_lock lock(mutex_);
      ++idle_workers_;
      work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      --idle_workers_;
      if (stopping_) return;
      connection = std::move(queue_.front());
      queue_.pop_front();
      if (queue_.empty()) drain(need_worker_fd_);
      serving_.insert(connection.get());
    }
    serve(*connection);
    const bool keep = connection->fd >= 0 && accepting_ && !stopping_;
    {
      std::lock_guard lock(mutex_);
      serving_.erase(connection.get());
    }
    if (keep) park(std::move(connection));
  }
}

// Serves the requests the connection has ready; leaves fd = -1 when it must close.
void HttpListener::serve(Connection& connection) {
  if (connection.header_too_large) {
    send_error(connection.fd, 431, "Request Header Fields Too Large",
               "request header exceeds " + std::to_string(options_.max_header_bytes) +
                   " bytes (server.max_header_bytes)");
    connection.fd = -1;
    return;
  }
  try {
    if (!connection.session) {
      if (tls_) {
        // A TLS record starts with 0x16; a letter is a plain HTTP request on the wrong scheme.
        char first = 0;
        if (::recv(connection.fd, &first, 1, MSG_PEEK | MSG_DONTWAIT) == 1 &&
            first >= 'A' && first <= 'Z') {
          send_error(connection.fd, 400, "Bad Request", "this port speaks https");
          connection.fd = -1;
          return;
        }
        connection.socket = Poco::Net::SecureStreamSocket::attach(connection.socket, tls_);
      }
      connection.session = std::make_unique<Session>(connection.socket, params_);
    }
    while (serve_one(connection)) {
      // Another request already read ahead (pipelining) or decrypted: serve it now, since
      // the poller would not hear of it.
      // (Plain bytes still in the kernel go back to the poller, which waits for the header.)
      const bool decrypted = tls_ && connection.socket.available() > 0;
      if (!connection.session->has_buffered_input() && !decrypted && !next_request_soon(connection)) {
        return;
      }
      if (!accepting_ || stopping_) break;
    }
  } catch (const std::exception& error) {
    log::debug("connection closed: ", error.what());
  }
  connection.fd = -1;
}

// Whether the connection's next request arrived, header complete, within a short wait. A
// busy client's next request usually follows within microseconds; serving it here saves the
// round trip through the poller. Only while another worker is idle, so lingering never
// delays a request waiting in the queue, and never for a partial header (the poller's job).
bool HttpListener::next_request_soon(Connection& connection) {
  if (tls_ || idle_workers_ == 0 || !accepting_) return false;
  // A request queued with no idle worker ends every linger (need_worker_fd_).
  pollfd ready[2] = {{connection.fd, POLLIN, 0}, {need_worker_fd_, POLLIN, 0}};
  if (::poll(ready, 2, kLingerMilliseconds) < 1 || ready[1].revents != 0 ||
      (ready[0].revents & POLLIN) == 0) {
    return false;
  }
  thread_local std::vector<char> peek;
  peek.resize(static_cast<std::size_t>(options_.max_header_bytes));
  const ssize_t peeked = ::recv(connection.fd, peek.data(), peek.size(), MSG_PEEK | MSG_DONTWAIT);
  if (peeked <= 0) return false;
  const std::string_view bytes(peek.data(), static_cast<std::size_t>(peeked));
  return header_end(bytes) != std::string_view::npos;
}

// One request and its response, as Poco's HTTPServerConnection does it. Whether the
// connection may carry another.
bool HttpListener::serve_one(Connection& connection) {
  Session& session = *connection.session;
  try {
    Poco::Net::HTTPServerResponseImpl response(session);
    Poco::Net::HTTPServerRequestImpl request(response, session, params_.get());
    response.setDate(Poco::Timestamp());
    response.setVersion(request.getVersion());
    response.setKeepAlive(request.getKeepAlive() && accepting_);
    response.set("Server", "vllmd");
    std::unique_ptr<Poco::Net::HTTPRequestHandler> handler(factory_->createRequestHandler(request));
    if (request.getExpectContinue() && response.getStatus() == HTTPResponse::HTTP_OK) {
      response.sendContinue();
    }
    handler->handleRequest(request, response);
    return response.getKeepAlive() && accepting_ && !stopping_;
  } catch (const Poco::Net::NoMessageException&) {
    return false;  // the client closed between requests
  } catch (const Poco::Net::MessageException& error) {
    log::debug("malformed request: ", error.displayText());
    send_error(connection.fd, 400, "Bad Request", "malformed HTTP request");
    return false;
  }
}

}  // namespace vllmd::daemon
