#pragma once
// One request and the application's handle for answering it, from any thread: a response
// at once, or a stream of chunks. Its bytes reach the event loop through the Mailbox.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/api/call.hpp"
#include "common/util/cidr.hpp"
#include "daemon/http/mailbox.hpp"
#include "daemon/http/parser.hpp"
#include "daemon/http/response.hpp"

namespace vllmd::daemon::http {

using Clock = std::chrono::steady_clock;

struct Request {
  std::string head_bytes;  // the request line and fields as received
  RequestHead head;        // views into head_bytes
  std::string body;        // decoded (chunked) or as sent
  std::optional<util::IpAddress> peer;
  Clock::time_point head_at;  // when the head was complete
  Clock::time_point body_at;  // when the body was (= head_at without one)
};

class Connection;

// One request and its response. Thread-safe; answering twice is ignored. An exchange dropped
// unanswered answers 500 itself, so a connection never hangs on a lost request. It is also
// the api::ResponseStream a generation streams through (holding it keeps the request alive).
class Exchange final : public api::ResponseStream {
 public:
  // backlog() at or above this: not writable().
  static constexpr std::size_t kHighWatermark = std::size_t{64} << 10;

  Exchange(std::shared_ptr<Mailbox> mailbox, std::uint64_t connection, Request request);
  ~Exchange() override;
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  Request& request() { return request_; }
  const Request& request() const { return request_; }

  void respond(const Response& response);

  // Streaming: the head now, data as it comes, then the end. HTTP/1.1 clients get chunked
  // transfer coding; HTTP/1.0 clients a body delimited by closing the connection. Writes
  // after a cancel post nothing.
  void stream_begin(int status, std::string_view content_type, const Headers& headers = {});
  void stream_write(std::string data);
  void stream_end();
  // api::ResponseStream: stream_begin with what an event stream needs (no proxy may cache
  // or buffer it), and stream_write.
  void begin(int status, std::string_view content_type) override;
  void write(std::string bytes) override { stream_write(std::move(bytes)); }

  // Answered, or cancelled.
  bool answered() const;

  // Runs once, on the loop thread, when the response can no longer reach the client: it hung
  // up while the request was handled or streamed (FIN with cancel_on_hangup, a reset, a failed
  // or stalled write), the server was aborted, or abort() was called. Never after the
  // response's last bytes were queued (respond() or stream_end()). Set it at most once (a
  // second is ignored), from any thread, before answering; set after the connection is
  // already gone, it runs at once on the caller's thread.
  void on_cancel(std::function<void()> cancelled) override;
  // Bytes this exchange posted that are not yet written to the socket (in the mailbox or the
  // connection's output buffer). Any thread; approximate: the loop reports writes in
  // batches, so it may read up to 16 KiB high while the reader keeps up, and it is exact
  // once a reader that fell behind has caught up.
  std::size_t backlog() const override;
  // backlog() below kHighWatermark: a producer merges its deltas while false.
  bool writable() const override;
  // Cuts the connection now (the reader is too slow for the producer's hard limit): any
  // thread; fires on_cancel; the client sees the stream cut.
  void abort() override;

 private:
  friend class Connection;  // the loop's side: hang_up() and written()

  // One atomic for the answer and the stream's keep-alive, so the producer's stream_end on
  // one thread reads what stream_begin set on another. kCancelled wins over kDone or not at
  // all: that is what keeps a cancel from following the last bytes.
  enum class State : std::uint8_t { kOpen, kStreaming, kStreamingKeepAlive, kDone, kCancelled };
  static bool streaming(State state) {
    return state == State::kStreaming || state == State::kStreamingKeepAlive;
  }

  // The connection is gone (loop thread): cancelled unless answered already.
  void hang_up();
  // `bytes` more of this exchange's went to the socket (loop thread only).
  void written(std::size_t bytes);
  void fire_cancel();
  void send(std::string bytes, Mailbox::Then then);

  // What a producer touches per event, together on the first cache line.
  std::atomic<State> state_{State::kOpen};
  bool chunked_;  // HTTP/1.1: chunked transfer coding
  std::uint64_t connection_;
  std::shared_ptr<Mailbox> mailbox_;
  // backlog() = posted_ - written_: producers add to the one (on the line above), the loop to
  // the other (on a line of its own), so neither takes the other's line per event.
  std::atomic<std::size_t> posted_{0};
  alignas(64) std::atomic<std::size_t> written_{0};
  Request request_;
  // Registration against firing only: taken once or twice per exchange, never per write.
  std::mutex cancel_mutex_;
  std::function<void()> on_cancel_;
  bool cancel_set_ = false;
  bool cancel_fired_ = false;
};

using ExchangePtr = std::shared_ptr<Exchange>;

}  // namespace vllmd::daemon::http
