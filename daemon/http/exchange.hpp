#pragma once
// One request and the application's handle for answering it, from any thread: a response
// at once, or a stream of chunks. Its bytes reach the event loop through the Mailbox.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/util/cidr.hpp"
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

struct Mailbox;

// One request and its response. Thread-safe; answering twice is ignored. An exchange dropped
// unanswered answers 500 itself, so a connection never hangs on a lost request.
class Exchange {
 public:
  Exchange(std::shared_ptr<Mailbox> mailbox, std::uint64_t connection, Request request);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  Request& request() { return request_; }
  const Request& request() const { return request_; }

  void respond(const Response& response);

  // Streaming: the head now, data as it comes, then the end. HTTP/1.1 clients get chunked
  // transfer coding; HTTP/1.0 clients a body delimited by closing the connection.
  void stream_begin(int status, std::string_view content_type, const Headers& headers = {});
  void stream_write(std::string_view data);
  void stream_end();

  bool answered() const;

 private:
  void send(std::string bytes, bool last, bool close);

  std::shared_ptr<Mailbox> mailbox_;
  std::uint64_t connection_;
  Request request_;
  enum class State { kOpen, kStreaming, kDone };
  std::atomic<State> state_{State::kOpen};
  bool keep_alive_ = true;
};

using ExchangePtr = std::shared_ptr<Exchange>;

}  // namespace vllmd::daemon::http
