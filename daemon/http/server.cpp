#include "daemon/http/server.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/util/cidr.hpp"
#include "common/util/duration.hpp"
#include "common/util/errno_text.hpp"
#include "common/util/log.hpp"
#include "daemon/http/connection.hpp"
#include "daemon/http/mailbox.hpp"
#include "daemon/http/transport.hpp"

namespace vllmd::daemon::http {

namespace {

constexpr std::uint64_t kListenerId = 0;
constexpr std::uint64_t kWakeId = 1;
constexpr auto kTick = std::chrono::milliseconds(250);
// Deliveries a drain hands on before the loop looks at its sockets again: with an engine step
// bringing an event for each of thousands of streams (a write of 6-30 us each, as the reader
// it wakes takes the CPU or not), a new request is still read within half a millisecond.
constexpr std::size_t kDeliveriesPerDrain = 16;

std::optional<util::IpAddress> peer_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return util::IpAddress::from_bytes(&reinterpret_cast<const sockaddr_in&>(address).sin_addr, 4);
  }
  if (address.ss_family == AF_INET6) {
    return util::IpAddress::from_bytes(&reinterpret_cast<const sockaddr_in6&>(address).sin6_addr,
                                       16);
  }
  return std::nullopt;
}

std::string address_text(const std::string& host, int port) {
  return util::join_host_port(host, std::to_string(port));
}

// A listening socket without SO_REUSEPORT: a second vllmd on the same port fails here rather
// than splitting the requests with the first.
int listen_on(const std::string& host, int port, int backlog, std::uint16_t& bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int error =
          ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      error != 0) {
    throw std::runtime_error("cannot listen on " + address_text(host, port) + ": " +
                             ::gai_strerror(error));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket: " + util::errno_text(errno));
  const int on = 1;
  const int off = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // restarts while in TIME_WAIT
  if (found->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
  if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
    const std::string reason = util::errno_text(errno);
    ::close(fd);
    throw std::runtime_error("cannot listen on " + address_text(host, port) + ": " + reason);
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(bound).sin6_port
                                        : reinterpret_cast<const sockaddr_in&>(bound).sin_port);
  return fd;
}

std::string peer_text(const std::optional<util::IpAddress>& peer) {
  return peer ? peer->to_string() : "-";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The loop

struct Server::Impl final : ConnectionHost {
  struct Slot {
    std::unique_ptr<Connection> connection;
    std::uint32_t events = 0;  // as registered with epoll
  };

  ServerOptions options;
  Decide decide_request;
  ConnectionLimits limits;
  std::unique_ptr<TlsContext> tls;
  int listen_fd = -1;
  int epoll_fd = -1;
  std::uint16_t port = 0;
  std::shared_ptr<Mailbox> mailbox = std::make_shared<Mailbox>();
  std::thread thread;
  std::atomic<bool> accepting{true};
  std::atomic<bool> quit{false};
  std::atomic<int> open{0};
  std::atomic<int> handling{0};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<std::uint64_t> total{0};

  // The loop thread's.
  std::unordered_map<std::uint64_t, Slot> slots;
  // Connections whose epoll interest may have changed this round: applied once at its end,
  // so a request answered within the round costs no epoll_ctl at all.
  std::vector<std::uint64_t> touched;
  std::vector<Mailbox::Delivery> deliveries;  // drained, reused round after round
  std::size_t next_delivery = 0;              // of `deliveries`, the first not yet delivered
  std::vector<std::uint64_t> delivered;       // connections with bytes to flush
  std::vector<std::function<void()>> tasks;
  std::uint64_t next_id = 2;
  bool listening = true;
  bool accept_paused = false;
  std::string scratch = std::string(std::size_t{64} << 10, '\0');

  ~Impl() override {
    if (listen_fd >= 0) ::close(listen_fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (mailbox->wake_fd >= 0) ::close(mailbox->wake_fd);
  }

  // ConnectionHost
  Decision decide(const RequestHead& head, const std::optional<util::IpAddress>& peer) override {
    return decide_request(head, peer);
  }
  ExchangePtr dispatch(std::uint64_t connection, Request request,
                       const std::function<void(ExchangePtr)>& on_request) override {
    auto exchange = std::make_shared<Exchange>(mailbox, connection, std::move(request));
    try {
      on_request(exchange);
    } catch (const std::exception& error) {
      util::log::error("request handler failed: ", error.what());
      exchange->respond(
          error_response(api::server_error(std::string("internal error: ") + error.what())));
    }
    return exchange;
  }
  bool stopping() const override { return mailbox->stopping.load(); }
  std::string& read_buffer() override { return scratch; }
  void log_refusal(const std::optional<util::IpAddress>& peer, const RequestHead* head, int status,
                   std::string_view message) override {
    util::log::info(peer_text(peer), " ", head ? util::log::escaped(head->method) : "-", " ",
                    head ? util::log::escaped(head->target) : "-", " ", status, " (",
                    util::log::escaped(message), ")");
  }

  void run();
  void accept_all();
  void add(int fd, const sockaddr_storage& address);
  void on_event(std::uint64_t id, std::uint32_t events);
  template <typename Step> void step(std::uint64_t id, Step&& action);
  void drain_mailbox();
  bool drain_pending() const;  // deliveries or tasks the last drain's budget left
  void apply_interest();
  void tick(Clock::time_point now);
  void stop_listening();
};

template <typename Step> void Server::Impl::step(std::uint64_t id, Step&& action) {
  const auto found = slots.find(id);
  if (found == slots.end()) return;  // closed meanwhile: its late answer goes nowhere
  Slot& slot = found->second;
  const bool was_handling = slot.connection->handling();
  const bool keep = action(*slot.connection);
  const bool is_handling = keep && slot.connection->handling();
  handling += static_cast<int>(is_handling) - static_cast<int>(was_handling);
  if (!keep) {
    slots.erase(found);  // closes the socket, which leaves the epoll set
    --open;
    return;
  }
  if (slot.connection->wanted_events() != slot.events) touched.push_back(id);
}

void Server::Impl::apply_interest() {
  for (const std::uint64_t id : touched) {
    const auto found = slots.find(id);
    if (found == slots.end()) continue;
    Slot& slot = found->second;
    const std::uint32_t wanted = slot.connection->wanted_events();
    if (wanted == slot.events) continue;
    epoll_event event{};
    event.events = wanted;
    event.data.u64 = id;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, slot.connection->fd(), &event);
    slot.events = wanted;
  }
  touched.clear();
}

void Server::Impl::run() {
  mailbox->loop = std::this_thread::get_id();
  std::vector<epoll_event> events(256);
  auto last_tick = Clock::now();
  while (!quit.load()) {
    // Deliveries left over by a drain's budget: look at the sockets, then go on with them.
    const int ready = ::epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()),
                                   drain_pending() ? 0 : static_cast<int>(kTick.count()));
    if (!accepting.load() && listening) stop_listening();
    for (int i = 0; i < ready; ++i) {
      const std::uint64_t id = events[static_cast<std::size_t>(i)].data.u64;
      if (id == kWakeId) {
        std::uint64_t count = 0;
        [[maybe_unused]] const ssize_t got = ::read(mailbox->wake_fd, &count, sizeof count);
      } else if (id == kListenerId) {
        if (listening) accept_all();
      } else {
        on_event(id, events[static_cast<std::size_t>(i)].events);
        // Answers given on this thread go out now, not after the whole round: with many
        // ready connections the first one's answer would otherwise wait for all the others.
        drain_mailbox();
      }
    }
    drain_mailbox();
    const auto now = Clock::now();
    if (now - last_tick >= kTick) {
      tick(now);
      last_tick = now;
    }
    apply_interest();
  }
  // Aborted: the connections end here, so the cancels of their requests run on this thread.
  slots.clear();
}

void Server::Impl::on_event(std::uint64_t id, std::uint32_t events) {
  step(id, [events](Connection& connection) {
    if ((events & EPOLLERR) != 0) return false;
    if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) != 0) {
      if ((connection.wanted_events() & EPOLLIN) != 0) {
        if (!connection.on_readable()) return false;
      } else if ((events & EPOLLHUP) != 0 ||
                 ((events & EPOLLRDHUP) != 0 && connection.cancels_on_hangup())) {
        // Nothing is being read: a hang-up is a reset, and a half-close during cancellable
        // work counts as leaving too.
        return false;
      }
    }
    return (events & EPOLLOUT) == 0 || connection.on_writable();
  });
}

void Server::Impl::drain_mailbox() {
  std::size_t budget = kDeliveriesPerDrain;
  while (budget > 0) {
    if (next_delivery == deliveries.size()) {
      for (auto& task : tasks) task();  // a batch's tasks run after its deliveries
      tasks.clear();
      deliveries.clear();
      next_delivery = 0;
      if (!mailbox->pending.exchange(false)) break;
      std::lock_guard lock(mailbox->mutex);
      deliveries.swap(mailbox->deliveries);
      tasks.swap(mailbox->tasks);
      continue;
    }
    const std::size_t end = std::min(deliveries.size(), next_delivery + budget);
    budget -= end - next_delivery;
    for (; next_delivery < end; ++next_delivery) {
      Mailbox::Delivery& delivery = deliveries[next_delivery];
      step(delivery.connection, [this, &delivery](Connection& connection) {
        if (!connection.flush_due()) delivered.push_back(delivery.connection);
        return connection.deliver(std::move(delivery.bytes), delivery.then);
      });
    }
    // One write per connection, however many events it got: with thousands of streams each
    // fed once per engine step, that is one write per stream per step.
    for (const std::uint64_t id : delivered) {
      step(id, [](Connection& connection) { return connection.flush_delivered(); });
    }
    delivered.clear();
  }
}

bool Server::Impl::drain_pending() const {
  return next_delivery < deliveries.size() || !tasks.empty() || mailbox->pending.load();
}

void Server::Impl::tick(Clock::time_point now) {
  if (accept_paused && listening) {
    accept_paused = false;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kListenerId;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &event);
  }
  std::vector<std::uint64_t> ids;
  ids.reserve(slots.size());
  for (const auto& [id, slot] : slots) ids.push_back(id);
  for (const std::uint64_t id : ids) {
    step(id, [now](Connection& connection) { return connection.on_tick(now); });
  }
}

void Server::Impl::stop_listening() {
  ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
  ::close(listen_fd);
  listen_fd = -1;
  listening = false;
  std::vector<std::uint64_t> ids;
  for (const auto& [id, slot] : slots) ids.push_back(id);
  for (const std::uint64_t id : ids) {
    step(id, [](Connection& connection) { return connection.on_stop(); });
  }
}

void Server::Impl::accept_all() {
  for (;;) {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&address), &length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors (EMFILE/ENFILE): the backlog stays readable, so stop watching it
        // for a tick instead of spinning.
        util::log::warning("accept: ", util::errno_text(errno),
                           "; pausing new connections briefly");
        ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
        accept_paused = true;
      }
      return;
    }
    ++total;
    if (open.load() >= options.max_connections) {
      ++refused;
      const std::string response = serialize(
          error_response(api::server_busy("too many connections (server.max_connections)")), false);
      [[maybe_unused]] const ssize_t sent =
          ::send(fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      ::close(fd);
      continue;
    }
    add(fd, address);
  }
}

void Server::Impl::add(int fd, const sockaddr_storage& address) {
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  const std::uint64_t id = next_id++;
  auto connection = std::make_unique<Connection>(
      id, fd, tls ? tls->accept(fd) : plain_transport(fd), peer_of(address), *this, limits);
  epoll_event event{};
  event.events = connection->wanted_events();
  event.data.u64 = id;
  if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) return;  // closed as it goes
  slots.emplace(id, Slot{std::move(connection), event.events});
  ++open;
}

// ---------------------------------------------------------------------------------------------

Server::Server(ServerOptions options, Decide decide) : impl_(std::make_unique<Impl>()) {
  Impl& io = *impl_;
  io.options = std::move(options);
  io.decide_request = std::move(decide);
  const auto seconds = [](double value) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(value));
  };
  io.limits = ConnectionLimits{seconds(io.options.timeout), seconds(io.options.keep_alive_timeout),
                               static_cast<std::size_t>(io.options.max_header_bytes),
                               io.options.discard_limit};
  if (!io.options.tls_cert_file.empty()) {
    io.tls = std::make_unique<TlsContext>(io.options.tls_cert_file, io.options.tls_key_file);
  }
  io.listen_fd = listen_on(io.options.host, io.options.port,
                           std::clamp(io.options.max_connections, 64, 4096), io.port);
  io.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  io.mailbox->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (io.epoll_fd < 0 || io.mailbox->wake_fd < 0) {
    throw std::runtime_error("epoll: " + util::errno_text(errno));
  }
  for (const auto& [fd, id] :
       {std::pair{io.listen_fd, kListenerId}, std::pair{io.mailbox->wake_fd, kWakeId}}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = id;
    ::epoll_ctl(io.epoll_fd, EPOLL_CTL_ADD, fd, &event);
  }
}

Server::~Server() { abort(); }

void Server::start() {
  impl_->thread = std::thread([this] {
    pthread_setname_np(pthread_self(), "vllmd-http");
    impl_->run();
  });
}

std::uint16_t Server::port() const { return impl_->port; }
bool Server::secure() const { return impl_->tls != nullptr; }

void Server::stop_accepting() {
  impl_->mailbox->stopping = true;
  impl_->accepting = false;
  impl_->mailbox->wake();
}

bool Server::wait_idle(double seconds) const {
  const auto deadline = Clock::now() + util::milliseconds_of(seconds);
  while (impl_->open.load() > 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void Server::abort() {
  impl_->quit = true;
  {
    std::lock_guard lock(impl_->mailbox->mutex);
    impl_->mailbox->open = false;
  }
  impl_->mailbox->wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->slots.clear();
  impl_->open = 0;
  impl_->handling = 0;
}

ServerStats Server::stats() const {
  return {impl_->open.load(), impl_->handling.load(), impl_->refused.load(), impl_->total.load()};
}

}  // namespace vllmd::daemon::http
