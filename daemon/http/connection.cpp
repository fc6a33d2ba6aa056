#include "daemon/http/connection.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/util/duration.hpp"
#include "common/util/memory.hpp"

namespace vllmd::daemon::http {

namespace {

using Status = IoResult::Status;

constexpr int kReadRounds = 64;  // reads per readiness event, so one client cannot hog the loop
constexpr auto kLinger = std::chrono::seconds(2);
constexpr std::size_t kMaxLingerBytes = 1 << 20;
// A client that sends requests without reading the answers gets no more served once this
// much is waiting to go out to it: it costs bounded memory and loop time.
constexpr std::size_t kMaxUnsent = std::size_t{256} << 10;

std::string seconds_of(Clock::duration duration) {
  return util::seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(duration));
}

}  // namespace

Connection::Connection(std::uint64_t id, int fd, std::unique_ptr<Transport> transport,
                       std::optional<util::IpAddress> peer, ConnectionHost& host,
                       const ConnectionLimits& limits)
    : transport_(std::move(transport)), id_(id), fd_(fd), peer_(peer), host_(host),
      limits_(limits) {
  phase_since_ = last_progress_ = Clock::now();
}

Connection::~Connection() {
  if (const ExchangePtr exchange = exchange_.lock()) exchange->hang_up();
  transport_.reset();
  ::close(fd_);
}

bool Connection::reading() const {
  if (phase_ == Phase::kHead) return out_.size() - out_sent_ <= kMaxUnsent;
  return phase_ == Phase::kBody || phase_ == Phase::kDiscard || phase_ == Phase::kLinger;
}

std::uint32_t Connection::wanted_events() const {
  std::uint32_t events = 0;
  if (reading() && !peer_closed_) {
    events |= EPOLLIN | EPOLLRDHUP;
  } else if (cancels_on_hangup()) {
    events |= EPOLLRDHUP;  // not EPOLLIN: pipelined bytes would wake the loop again and again
  }
  if (out_sent_ < out_.size() || wants_write_) events |= EPOLLOUT;
  return events;
}

// ---------------------------------------------------------------------------------------------
// Reading

bool Connection::on_readable() {
  for (int round = 0; round < kReadRounds || transport_->pending(); ++round) {
    if (!reading() || peer_closed_) break;
    IoResult result;
    std::size_t asked = 0;
    const bool into_body = phase_ == Phase::kBody && !chunked_ && in_.empty();
    if (into_body) {
      std::string& body = request_->body;
      asked = body.size() - body_received_;
      result = transport_->read(body.data() + body_received_, asked);
      if (result.status == Status::kOk) body_received_ += result.bytes;
    } else {
      std::string& scratch = host_.read_buffer();
      asked = scratch.size();
      result = transport_->read(scratch.data(), asked);
      if (result.status == Status::kOk) {
        if (phase_ == Phase::kLinger) {
          lingered_bytes_ += result.bytes;
          if (lingered_bytes_ > kMaxLingerBytes) return false;
          continue;
        }
        in_.append(scratch.data(), result.bytes);
      }
    }
    if (result.status == Status::kWouldBlock) {
      wants_write_ = result.wants_write;
      break;
    }
    if (result.status == Status::kNotTls) {
      const std::string response = serialize(
          error_response(api::bad_request("this port speaks https, not plain http")), false);
      [[maybe_unused]] const ssize_t sent =
          ::send(fd_, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      return false;
    }
    if (result.status == Status::kError) return false;
    if (result.status == Status::kClosed) {
      peer_closed_ = true;
      break;
    }
    last_progress_ = Clock::now();
    if (!process()) return false;
    // A short read drained the socket: the next bytes will be announced (level-triggered),
    // so asking again now would only cost a read that finds nothing.
    if (result.bytes < asked && !transport_->pending()) break;
  }
  return peer_closed_ ? on_peer_closed() : true;
}

// Consumes what `in_` holds, as far as the current phase allows.
bool Connection::process() {
  for (;;) {
    switch (phase_) {
      case Phase::kHead: {
        if (in_.empty() || !reading()) return true;  // answers pile up: wait for the client
        if (!head_started_) {
          head_started_ = true;
          phase_since_ = Clock::now();  // from the first byte, the whole head gets `timeout`
        }
        const std::size_t end = find_head_end(in_, scanned_);
        if (end == std::string::npos || end > limits_.max_header_bytes) {
          if (end != std::string::npos || in_.size() > limits_.max_header_bytes) {
            return refuse(api::header_too_large("request header exceeds " +
                                                std::to_string(limits_.max_header_bytes) +
                                                " bytes (server.max_header_bytes)"));
          }
          scanned_ = in_.size() >= 3 ? in_.size() - 3 : 0;
          return true;
        }
        if (!on_head(end)) return false;
        break;
      }
      case Phase::kBody:
        if (!on_body_bytes()) return false;
        if (phase_ == Phase::kBody) return true;
        break;
      case Phase::kDiscard: {
        const auto drop =
            static_cast<std::size_t>(std::min<std::uint64_t>(discard_left_, in_.size()));
        in_.erase(0, drop);
        discard_left_ -= drop;
        if (discard_left_ > 0) return true;
        begin_request();
        break;
      }
      case Phase::kLinger: in_.clear(); return true;
      case Phase::kHandling:
      case Phase::kClosing: return true;  // the next request waits in in_
    }
  }
}

bool Connection::on_head(std::size_t end) {
  Request request;
  request.head_bytes.assign(in_, 0, end);
  in_.erase(0, end);
  scanned_ = 0;
  request.peer = peer_;
  request.head_at = Clock::now();
  auto head = parse_head(request.head_bytes);
  if (!head) {
    host_.log_refusal(peer_, nullptr, head.error().status, head.error().message);
    return refuse(api::http_error(head.error().status, head.error().message));
  }
  request.head = std::move(*head);
  const RequestHead& parsed = request.head;
  Decision decision = host_.decide(parsed, peer_);
  if (!decision.refusal && parsed.framing == BodyFraming::kLength &&
      parsed.content_length > decision.body_limit) {
    decision.refusal = error_response(api::payload_too_large(
        "request body exceeds the limit of " + std::to_string(decision.body_limit) + " bytes"));
  }
  if (decision.refusal) {
    // Decided from the head alone: a small body is read and dropped so the connection can
    // carry the next request; a large or chunked one is not read at all.
    const bool small_body =
        parsed.framing == BodyFraming::kLength && parsed.content_length <= limits_.discard_limit;
    const bool close = decision.refusal->close || !parsed.keep_alive || host_.stopping() ||
                       (parsed.has_body() && !small_body);
    queue(serialize(*decision.refusal, !close));
    if (close) {
      phase_ = Phase::kClosing;
    } else if (parsed.has_body()) {
      discard_left_ = parsed.content_length;
      phase_ = Phase::kDiscard;
      last_progress_ = Clock::now();
    } else {
      begin_request();
    }
    return flush();
  }
  body_limit_ = decision.body_limit;
  cancel_on_hangup_ = decision.cancel_on_hangup;
  on_request_ = std::move(decision.on_request);
  if (parsed.framing == BodyFraming::kLength) {
    const auto length = static_cast<std::size_t>(parsed.content_length);
    request.body.reserve(length);
    util::advise_huge_pages(request.body.data(), request.body.capacity());
    request.body.resize(length);
    body_received_ = 0;
  } else if (parsed.framing == BodyFraming::kChunked) {
    chunked_ = std::make_unique<ChunkedDecoder>(body_limit_, limits_.max_header_bytes);
  }
  const bool has_body = parsed.has_body();
  // 100 Continue only now that every check passed.
  if (parsed.expect_continue && has_body) queue(kContinue);
  request_ = std::move(request);
  if (!has_body) return finish_request();
  phase_ = Phase::kBody;
  last_progress_ = Clock::now();
  return flush();
}

bool Connection::on_body_bytes() {
  Request& request = *request_;
  if (!chunked_) {
    const std::size_t take = std::min(in_.size(), request.body.size() - body_received_);
    std::memcpy(request.body.data() + body_received_, in_.data(), take);
    in_.erase(0, take);
    body_received_ += take;
    return body_received_ == request.body.size() ? finish_request() : true;
  }
  std::size_t consumed = 0;
  const ChunkedDecoder::Status status = chunked_->feed(in_, consumed, request.body);
  in_.erase(0, consumed);
  if (status == ChunkedDecoder::Status::kError) {
    const ParseError& error = chunked_->error();
    host_.log_refusal(peer_, &request.head, error.status, error.message);
    return refuse(api::http_error(error.status, error.message));
  }
  return status == ChunkedDecoder::Status::kDone ? finish_request() : true;
}

// The request is complete: to the application.
bool Connection::finish_request() {
  Request request = std::move(*request_);
  request_.reset();
  chunked_.reset();
  request.body_at = request.head.has_body() ? Clock::now() : request.head_at;
  phase_ = Phase::kHandling;
  auto on_request = std::move(on_request_);
  on_request_ = nullptr;
  unsent_before_ = out_.size() - out_sent_;
  unpublished_ = 0;
  stalled_ = false;
  exchange_ = host_.dispatch(id_, std::move(request), on_request);
  return flush();  // a 100 Continue may still be unsent
}

bool Connection::on_peer_closed() {
  switch (phase_) {
    case Phase::kHead:
      if (in_.empty()) return false;  // a client ending its connection between requests
      return refuse(
          api::bad_request("the connection ended before the request header was complete"));
    case Phase::kBody: {
      const std::string got = chunked_ ? "the chunked body ended before its last chunk"
                                       : "got " + std::to_string(body_received_) + " of " +
                                             std::to_string(request_->body.size()) + " bytes";
      host_.log_refusal(peer_, &request_->head, 400, "incomplete body: " + got);
      return refuse(api::bad_request("the request body is incomplete: " + got));
    }
    case Phase::kDiscard:
    case Phase::kLinger: return false;
    case Phase::kHandling:
    case Phase::kClosing: return true;  // the answer still goes out; then the connection ends
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Writing

bool Connection::refuse(const api::ApiError& error) {
  request_.reset();
  chunked_.reset();
  queue(serialize(error_response(error), false));
  phase_ = Phase::kClosing;
  return flush();
}

void Connection::queue(std::string_view bytes) {
  if (out_sent_ == out_.size()) {
    out_.clear();
    out_sent_ = 0;
  }
  out_.append(bytes);
}

// A streamed event usually finds the buffer written out: it becomes the buffer, uncopied.
void Connection::queue(std::string&& bytes) {
  if (out_sent_ == out_.size()) {
    out_ = std::move(bytes);
    out_sent_ = 0;
  } else {
    out_.append(bytes);
  }
}

void Connection::begin_request() {
  phase_ = Phase::kHead;
  head_started_ = false;
  phase_since_ = Clock::now();
}

bool Connection::deliver(std::string&& bytes, Mailbox::Then then) {
  flush_due_ = true;
  if (phase_ != Phase::kHandling) return true;
  if (then == Mailbox::Then::kCut) return false;
  queue(std::move(bytes));
  if (then == Mailbox::Then::kMore) return true;
  exchange_.reset();  // answered: its end is no cancel
  if (then == Mailbox::Then::kClose || peer_closed_ || host_.stopping()) {
    phase_ = Phase::kClosing;
  } else {
    begin_request();
    serve_next_ = true;
  }
  return true;
}

// After the mailbox is drained: one write for all of this round's deliveries, then the
// pipelined request a completed response lets through.
bool Connection::flush_delivered() {
  flush_due_ = false;
  if (!flush()) return false;
  if (!serve_next_) return true;
  serve_next_ = false;
  if (!process()) return false;
  // TLS may hold the next request decrypted already: the socket will not announce it.
  return transport_->pending() ? on_readable() : true;
}

bool Connection::on_writable() {
  const bool was_reading = reading();
  if (!flush()) return false;
  if (wants_write_) {  // a TLS read was waiting for the socket to become writable
    wants_write_ = false;
    return on_readable();
  }
  // The client read its answers: serve what it sent meanwhile.
  return was_reading || !reading() || process();
}

bool Connection::flush() {
  while (out_sent_ < out_.size()) {
    const IoResult result = transport_->write(out_.data() + out_sent_, out_.size() - out_sent_);
    if (result.status == Status::kOk) {
      out_sent_ += result.bytes;
      last_progress_ = Clock::now();
      count_written(result.bytes);
      continue;
    }
    if (result.status == Status::kWouldBlock) {
      stalled_ = true;
      return true;
    }
    return false;  // the client is gone
  }
  // A producer merging for a reader that was too slow learns at once that it caught up.
  if (stalled_) publish_written();
  out_.clear();
  out_sent_ = 0;
  if (out_.capacity() > (1 << 20)) out_.shrink_to_fit();
  if (phase_ == Phase::kClosing) start_linger();
  return !(phase_ == Phase::kLinger && peer_closed_);
}

// The exchange hears of its written bytes in batches: telling it costs a cache line that
// its producer, on another thread, reads per event, and an event's bytes are few. Its
// backlog() is then high by less than kPublishEvery while the reader keeps up, which
// changes no decision a producer takes on it; once a write would block, it is told exactly
// when the output drains.
void Connection::count_written(std::size_t bytes) {
  static constexpr std::size_t kPublishEvery = std::size_t{16} << 10;
  const std::size_t earlier = std::min(bytes, unsent_before_);
  unsent_before_ -= earlier;
  unpublished_ += bytes - earlier;
  if (unpublished_ >= kPublishEvery) publish_written();
}

void Connection::publish_written() {
  stalled_ = false;
  if (unpublished_ == 0) return;
  if (const ExchangePtr exchange = exchange_.lock()) exchange->written(unpublished_);
  unpublished_ = 0;
}

// Closing at once with unread bytes from the client would reset the connection, and the
// client might lose the response it was sent: shut down our side, then drop what it still
// sends for a moment.
void Connection::start_linger() {
  transport_->shutdown_write();
  phase_ = Phase::kLinger;
  phase_since_ = Clock::now();
  in_.clear();
}

// ---------------------------------------------------------------------------------------------
// Time

bool Connection::on_tick(Clock::time_point now) {
  switch (phase_) {
    case Phase::kHead:
      // An answer still going out: the client is reading it, or stalls (like a write).
      if (out_sent_ < out_.size()) return now - last_progress_ < limits_.timeout;
      if (!head_started_) return now - phase_since_ < limits_.keep_alive;
      if (now - phase_since_ < limits_.timeout) return true;
      host_.log_refusal(peer_, nullptr, 408, "request header stalled");
      return refuse(api::request_timeout("the request header did not arrive within " +
                                         seconds_of(limits_.timeout) + " (server.timeout)"));
    case Phase::kBody:
      if (now - last_progress_ < limits_.timeout) return true;
      host_.log_refusal(peer_, &request_->head, 408, "request body stalled");
      return refuse(api::request_timeout("the request body stalled for " +
                                         seconds_of(limits_.timeout) + " (server.timeout)"));
    case Phase::kHandling:
      // Only a response the client does not read can stall here.
      return out_sent_ == out_.size() || now - last_progress_ < limits_.timeout;
    case Phase::kDiscard:
    case Phase::kClosing: return now - last_progress_ < limits_.timeout;
    case Phase::kLinger: return now - phase_since_ < kLinger;
  }
  return false;
}

bool Connection::on_stop() {
  if (phase_ == Phase::kHead && !head_started_) return false;
  return phase_ != Phase::kDiscard;
}

}  // namespace vllmd::daemon::http
