#include "daemon/http/exchange.hpp"

#include <algorithm>

#include "common/util/log.hpp"

namespace vllmd::daemon::http {

using Then = Mailbox::Then;

Exchange::Exchange(std::shared_ptr<Mailbox> mailbox, std::uint64_t connection, Request request)
    : chunked_(request.head.minor_version == 1), connection_(connection),
      mailbox_(std::move(mailbox)), request_(std::move(request)) {}

Exchange::~Exchange() {
  State state = state_.load();
  if (state == State::kOpen) {
    util::log::error(
        "a request was dropped without an answer: ", util::log::escaped(request_.head.method), " ",
        util::log::escaped(request_.head.target));
    respond(error_response(api::server_error("internal error: the request got no answer")));
  } else if (streaming(state) && state_.compare_exchange_strong(state, State::kDone)) {
    send({}, Then::kClose);  // a cut stream tells the client something went wrong
  }
}

bool Exchange::answered() const { return state_.load() != State::kOpen; }

// Counted before it is posted: the loop may write it, and subtract it, at once.
void Exchange::send(std::string bytes, Then then) {
  posted_.fetch_add(bytes.size(), std::memory_order_relaxed);
  mailbox_->post(Mailbox::Delivery{connection_, std::move(bytes), then});
}

void Exchange::respond(const Response& response) {
  State expected = State::kOpen;
  if (!state_.compare_exchange_strong(expected, State::kDone)) return;
  const bool keep_alive = request_.head.keep_alive && !response.close && !mailbox_->stopping;
  send(serialize(response, keep_alive), keep_alive ? Then::kNext : Then::kClose);
}

void Exchange::stream_begin(int status, std::string_view content_type, const Headers& headers) {
  const bool keep_alive = chunked_ && request_.head.keep_alive && !mailbox_->stopping;
  State expected = State::kOpen;
  if (!state_.compare_exchange_strong(
          expected, keep_alive ? State::kStreamingKeepAlive : State::kStreaming)) {
    return;
  }
  send(serialize_stream_head(status, content_type, headers, keep_alive, chunked_), Then::kMore);
}

void Exchange::begin(int status, std::string_view content_type) {
  // Proxies must neither cache nor buffer an event stream (nginx honours X-Accel-Buffering).
  stream_begin(status, content_type, {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
}

void Exchange::stream_write(std::string data) {
  if (!streaming(state_.load()) || data.empty()) return;
  send(chunked_ ? chunk(std::move(data)) : std::move(data), Then::kMore);
}

void Exchange::stream_end() {
  State state = state_.load();
  do {
    if (!streaming(state)) return;
  } while (!state_.compare_exchange_weak(state, State::kDone));
  send(chunked_ ? std::string(kLastChunk) : std::string(),
       state == State::kStreamingKeepAlive ? Then::kNext : Then::kClose);
}

// ---------------------------------------------------------------------------------------------
// Cancel and backpressure

void Exchange::on_cancel(std::function<void()> cancelled) {
  {
    std::lock_guard lock(cancel_mutex_);
    if (cancel_set_) return;
    cancel_set_ = true;
    if (!cancel_fired_) {
      on_cancel_ = std::move(cancelled);
      return;
    }
  }
  cancelled();
}

void Exchange::abort() {
  State state = state_.load();
  do {
    if (state != State::kOpen && !streaming(state)) return;
  } while (!state_.compare_exchange_weak(state, State::kCancelled));
  // The loop drops the connection, whose end fires the cancel there.
  send({}, Then::kCut);
}

void Exchange::hang_up() {
  State state = state_.load();
  do {
    if (state == State::kDone) return;
  } while (state != State::kCancelled && !state_.compare_exchange_weak(state, State::kCancelled));
  fire_cancel();
}

void Exchange::fire_cancel() {
  std::function<void()> cancelled;
  {
    std::lock_guard lock(cancel_mutex_);
    if (cancel_fired_) return;
    cancel_fired_ = true;
    cancelled = std::move(on_cancel_);
  }
  if (cancelled) cancelled();
}

// Clamped: a miscount never wraps around to "everything is unsent".
std::size_t Exchange::backlog() const {
  const std::size_t written = written_.load(std::memory_order_relaxed);
  const std::size_t posted = posted_.load(std::memory_order_relaxed);
  return posted - std::min(posted, written);
}

bool Exchange::writable() const { return backlog() < kHighWatermark; }

void Exchange::written(std::size_t bytes) {
  written_.store(written_.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
}

}  // namespace vllmd::daemon::http
