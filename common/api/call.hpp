#pragma once
// One API call as the service's handlers see it, and the response they answer it with.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/api/generation_stats.hpp"
#include "common/api/request.hpp"
#include "common/wire/json_to_msgpack.hpp"

namespace vllmd::api {

struct Route;

struct Response {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  double engine_seconds = 0;  // time spent waiting for engines
  // A generation: sent through the call's ResponseStream (body and content_type unused), its
  // tokens and time to first token for the access log and metrics.
  bool streamed = false;
  std::int64_t tokens = 0;
  std::optional<double> first_token_seconds = std::nullopt;
  std::vector<ChoiceStats> choices = {};  // a generation's engine requests, for /metrics
};

// The way back to the client beyond one Response: a streamed answer, and the news that
// nobody waits for the answer any more. The daemon implements it over its HTTP exchange,
// tests record. Every method may be called from any thread; none blocks.
class ResponseStream {
 public:
  ResponseStream() = default;
  virtual ~ResponseStream() = default;
  ResponseStream(const ResponseStream&) = delete;
  ResponseStream& operator=(const ResponseStream&) = delete;

  // The head of a streamed answer, then its bytes; Done({.streamed = true}) ends it.
  virtual void begin(int status, std::string_view content_type) = 0;
  virtual void write(std::string bytes) = 0;
  // Bytes written and not yet taken by the client, and whether that is little enough to
  // write more now (else merge what comes meanwhile).
  virtual std::size_t backlog() const = 0;
  virtual bool writable() const = 0;
  // Runs once if the client can no longer get the answer (it hung up, or abort() cut it).
  // Set at most once; set after that happened, it runs at once.
  virtual void on_cancel(std::function<void()> cancelled) = 0;
  // Cuts the connection: the client reads too slowly for what waits for it.
  virtual void abort() = 0;
};

// The status a generation ends with when its client left (as nginx logs it): logged, never sent.
inline constexpr int kClientClosedRequest = 499;

// Every call ends in exactly one call of its Done, from whatever thread finished it (the
// caller's, an engine IO thread's or the executor's): it must not block.
using Done = std::function<void(Response)>;

struct Call {
  const Route* route = nullptr;
  Query query;
  std::string body;                    // raw; released once transcoded
  std::optional<std::string> session;  // the client's Vllmd-Session id (valid; none: nullopt)

  // The body member the route names, validated (before the call may queue or reach engines).
  std::optional<wire::Transcoded> document;  // the body, as msgpack
  std::string_view value;                    // the member's msgpack bytes, inside `document`
  std::optional<std::string> text;           // a string member (a version)
  std::string engine_args = "\x90";          // from the query (Route::engine_args); [] if none

  // Generation routes: the headers they read (as sent; checked by the handler), and the
  // way to stream the answer and hear of a client that left.
  std::optional<std::string> request_id_header;          // X-Request-Id
  std::optional<std::string> data_parallel_rank_header;  // X-data-parallel-rank
  std::optional<std::string> session_header;             // X-Session-ID
  std::shared_ptr<ResponseStream> stream;
};
using CallPtr = std::shared_ptr<Call>;

}  // namespace vllmd::api
