#pragma once
// One client connection as the event loop drives it: bytes in, requests parsed and framed,
// decided from the head, bodies read (or dropped), responses out in order. It never blocks;
// the loop calls it when its socket is ready, when a response is delivered and on ticks.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "daemon/http/server.hpp"
#include "daemon/http/transport.hpp"

namespace vllmd::daemon::http {

// What a connection needs from its loop.
class ConnectionHost {
 public:
  virtual ~ConnectionHost() = default;
  virtual Decision decide(const RequestHead& head, const std::optional<util::IpAddress>& peer) = 0;
  // Hands the request to the application; the exchange, for the connection to watch.
  virtual ExchangePtr dispatch(std::uint64_t connection, Request request,
                               const std::function<void(ExchangePtr)>& on_request) = 0;
  virtual bool stopping() const = 0;
  virtual std::string& read_buffer() = 0;  // the loop's scratch space for reads
  // A request refused by the connection layer itself (malformed, stalled, incomplete), for
  // the access log; `head` when it was parsed.
  virtual void log_refusal(const std::optional<util::IpAddress>& peer, const RequestHead* head,
                           int status, std::string_view message) = 0;
};

struct ConnectionLimits {
  Clock::duration timeout;
  Clock::duration keep_alive;
  std::size_t max_header_bytes;
  std::size_t discard_limit;
};

class Connection {
 public:
  Connection(std::uint64_t id, int fd, std::unique_ptr<Transport> transport,
             std::optional<util::IpAddress> peer, ConnectionHost& host,
             const ConnectionLimits& limits);
  ~Connection();  // closes the socket; a request still being handled is cancelled
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Each returns false when the connection is over and must be destroyed.
  bool on_readable();
  bool on_writable();
  // Queues a response's bytes; they are written by flush_delivered, once per loop round.
  bool deliver(std::string&& bytes, Mailbox::Then then);
  bool flush_delivered();
  bool flush_due() const { return flush_due_; }
  bool on_tick(Clock::time_point now);
  // Stop reading new requests: idle connections end now, busy ones after their response.
  bool on_stop();

  std::uint32_t wanted_events() const;  // EPOLLIN / EPOLLOUT / EPOLLRDHUP
  // Whether the client's half-close (EPOLLRDHUP) ends the connection now.
  bool cancels_on_hangup() const { return phase_ == Phase::kHandling && cancel_on_hangup_; }
  bool handling() const { return phase_ == Phase::kHandling; }
  int fd() const { return fd_; }

 private:
  enum class Phase {
    kHead,      // waiting for (the rest of) a request head
    kBody,      // reading an accepted request's body
    kDiscard,   // dropping a refused request's small body
    kHandling,  // the request is with the application
    kClosing,   // the last response is being written
    kLinger,    // written and shut down: dropping what the client still sends, then close
  };

  bool reading() const;  // whether bytes from the client are wanted now
  bool process();
  bool on_head(std::size_t end);
  bool on_body_bytes();
  bool flush();
  bool finish_request();
  bool refuse(const api::ApiError& error);  // answers and ends the connection
  void queue(std::string_view bytes);
  void queue(std::string&& bytes);
  void count_written(std::size_t bytes);
  void publish_written();
  void begin_request();
  void start_linger();
  bool on_peer_closed();

  // What every streamed event's write touches comes first, on as few cache lines as they
  // fit: thousands of streams are each written once per engine step.
  std::unique_ptr<Transport> transport_;
  Phase phase_ = Phase::kHead;
  bool peer_closed_ = false;
  bool wants_write_ = false;  // TLS needs the socket writable
  bool flush_due_ = false;    // delivered to this round
  bool serve_next_ = false;   // a response completed this round: the next request may start
  // Whether a write would have blocked since the exchange was last told (count_written).
  bool stalled_ = false;
  std::string out_;
  std::size_t out_sent_ = 0;
  // The request being handled (below) hears of its bytes written in batches: these are the
  // bytes not yet told, after what an earlier response left unsent is out.
  std::size_t unsent_before_ = 0;
  std::size_t unpublished_ = 0;
  Clock::time_point last_progress_;  // last byte in or out

  std::uint64_t id_;
  int fd_;
  std::optional<util::IpAddress> peer_;
  ConnectionHost& host_;
  const ConnectionLimits& limits_;

  std::string in_;           // received and not yet consumed
  std::size_t scanned_ = 0;  // of in_, searched for the end of the head

  // The request being read.
  std::optional<Request> request_;
  std::function<void(ExchangePtr)> on_request_;
  std::uint64_t body_limit_ = 0;
  std::size_t body_received_ = 0;  // with Content-Length: bytes of request_->body filled
  std::uint64_t discard_left_ = 0;
  std::unique_ptr<ChunkedDecoder> chunked_;
  bool cancel_on_hangup_ = false;

  // The request being handled: cancelled if the connection ends first.
  std::weak_ptr<Exchange> exchange_;

  Clock::time_point phase_since_;  // when the current phase (or head) began
  bool head_started_ = false;      // some bytes of the next head are in
  std::size_t lingered_bytes_ = 0;
};

}  // namespace vllmd::daemon::http
