// daemon/http: the stream contract of an Exchange over real loopback sockets. When the
// client goes away (FIN on a cancellable route, reset, abort, server abort) on_cancel runs
// once; when it was answered, never. Backpressure through backlog()/writable(), and one
// write per connection per loop round.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/http/server.hpp"
#include "tests/unit/daemon/loopback_client.hpp"

namespace http = vllmd::daemon::http;
using Client = vllmd::test::LoopbackClient;
using std::chrono::milliseconds;

namespace {

// Polls `done` until it holds or `limit` passes; whether it held.
template <typename Done> bool eventually(Done done, milliseconds limit = milliseconds(2000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// A server whose every request is kept for the test, with its cancel counted (unless not
// `watched`). `cancellable` sets Decision::cancel_on_hangup; `start` runs on the loop thread
// with each new exchange.
struct Fixture {
  std::mutex mutex;
  std::vector<http::ExchangePtr> exchanges;
  std::atomic<int> cancels{0};
  std::atomic<std::thread::id> cancelled_on;
  std::unique_ptr<http::Server> server;

  explicit Fixture(bool cancellable, std::function<void(const http::ExchangePtr&)> start = {},
                   const http::ServerOptions& options = {}, bool watched = true) {
    server = std::make_unique<http::Server>(
        options, [this, cancellable, start = std::move(start), watched](
                     const http::RequestHead&, const std::optional<vllmd::util::IpAddress>&) {
          http::Decision decision;
          decision.cancel_on_hangup = cancellable;
          decision.on_request = [this, start, watched](const http::ExchangePtr& exchange) {
            if (watched) {
              exchange->on_cancel([this] {
                cancelled_on = std::this_thread::get_id();
                ++cancels;
              });
            }
            {
              std::lock_guard lock(mutex);
              exchanges.push_back(exchange);
            }
            if (start) start(exchange);
          };
          return decision;
        });
    server->start();
  }

  http::ExchangePtr first() {
    REQUIRE(eventually([this] {
      std::lock_guard lock(mutex);
      return !exchanges.empty();
    }));
    std::lock_guard lock(mutex);
    return exchanges.front();
  }
  bool closed() {
    return eventually([this] { return server->stats().connections == 0; });
  }
};

http::Response text(std::string body) {
  http::Response response;
  response.content_type = "text/plain";
  response.body = std::move(body);
  return response;
}

void begin_events(const http::ExchangePtr& exchange) {
  exchange->stream_begin(200, "text/event-stream");
  exchange->stream_write("data: 0\n\n");
}

constexpr const char* kGet = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";

}  // namespace

TEST_CASE("a client's FIN cancels a cancellable request while it waits, once, on the loop") {
  Fixture fixture(true);
  Client client(fixture.server->port());
  client.send(kGet);
  const http::ExchangePtr exchange = fixture.first();
  const auto half_closed = std::chrono::steady_clock::now();
  client.half_close();
  REQUIRE(eventually([&] { return fixture.cancels == 1; }, milliseconds(1000)));
  // Seen through EPOLLRDHUP at once, not at a timer's tick.
  CHECK(std::chrono::steady_clock::now() - half_closed < milliseconds(200));
  CHECK(fixture.cancelled_on.load() != std::this_thread::get_id());
  CHECK(fixture.closed());
  exchange->respond(text("too late"));  // goes nowhere
  CHECK(client.read_all().empty());
  CHECK(fixture.cancels == 1);
}

TEST_CASE("a client's FIN cancels a cancellable stream mid-way; later writes post nothing") {
  Fixture fixture(true, begin_events);
  Client client(fixture.server->port());
  client.send(kGet);
  CHECK(client.read_until("data: 0\n\n").find("HTTP/1.1 200 OK") == 0);
  const http::ExchangePtr exchange = fixture.first();
  client.half_close();
  REQUIRE(eventually([&] { return fixture.cancels == 1; }, milliseconds(1000)));
  const std::size_t backlog = exchange->backlog();
  exchange->stream_write("data: 1\n\n");
  exchange->stream_end();
  CHECK(exchange->backlog() == backlog);
  CHECK(fixture.closed());
  CHECK(fixture.cancels == 1);
}

TEST_CASE("a reset cancels even a request that is not cancelled by a half-close") {
  Fixture fixture(false);
  Client client(fixture.server->port());
  client.send(kGet);
  const http::ExchangePtr exchange = fixture.first();
  client.reset();
  REQUIRE(eventually([&] { return fixture.cancels == 1; }, milliseconds(1000)));
  CHECK(fixture.closed());
  CHECK(fixture.cancels == 1);
}

TEST_CASE("a half-closed client of a route that is not cancellable still gets its answer") {
  Fixture fixture(false);
  Client client(fixture.server->port());
  client.send(kGet);
  const http::ExchangePtr exchange = fixture.first();
  client.half_close();
  // Long enough for the loop to see the FIN, had it asked for it.
  std::this_thread::sleep_for(milliseconds(50));
  CHECK(fixture.server->stats().handling == 1);
  exchange->respond(text("weights synced"));
  const std::string response = client.read_all();
  CHECK(response.find("HTTP/1.1 200 OK") == 0);
  CHECK(response.find("weights synced") != std::string::npos);
  CHECK(fixture.closed());
  CHECK(fixture.cancels == 0);
}

TEST_CASE("an answered exchange is not cancelled when its client then leaves") {
  SUBCASE("a response") {
    Fixture fixture(true, [](const http::ExchangePtr& exchange) { exchange->respond(text("ok")); });
    {
      Client client(fixture.server->port());
      client.send(kGet);
      CHECK(client.read_until("ok").find("HTTP/1.1 200 OK") == 0);
    }
    CHECK(fixture.closed());
    CHECK(fixture.cancels == 0);
  }
  SUBCASE("a stream") {
    Fixture fixture(true, [](const http::ExchangePtr& exchange) {
      begin_events(exchange);
      exchange->stream_end();
    });
    {
      Client client(fixture.server->port());
      client.send(kGet);
      CHECK(client.read_until("0\r\n\r\n").find("data: 0") != std::string::npos);
    }
    CHECK(fixture.closed());
    CHECK(fixture.cancels == 0);
  }
}

TEST_CASE("on_cancel set after the connection is gone runs at once on the caller's thread") {
  Fixture fixture(true, {}, {}, false);
  Client client(fixture.server->port());
  client.send(kGet);
  const http::ExchangePtr exchange = fixture.first();
  client.half_close();
  REQUIRE(fixture.closed());
  std::thread::id ran_on;
  exchange->on_cancel([&] { ran_on = std::this_thread::get_id(); });
  CHECK(ran_on == std::this_thread::get_id());
}

TEST_CASE("abort cuts the stream from any thread and cancels once, on the loop") {
  Fixture fixture(false, begin_events);
  Client client(fixture.server->port());
  client.send(kGet);
  CHECK(client.read_until("data: 0\n\n").find("HTTP/1.1 200 OK") == 0);
  const http::ExchangePtr exchange = fixture.first();
  exchange->abort();
  exchange->abort();
  REQUIRE(eventually([&] { return fixture.cancels == 1; }));
  CHECK(fixture.cancelled_on.load() != std::this_thread::get_id());
  // Cut: the last chunk never comes.
  CHECK(client.read_all().find("0\r\n\r\n") == std::string::npos);
  CHECK(fixture.closed());
  exchange->stream_end();
  CHECK(fixture.cancels == 1);
}

TEST_CASE("a client that does not read turns writable() false; reading turns it true again") {
  Fixture fixture(false, [](const http::ExchangePtr& exchange) {
    exchange->stream_begin(200, "application/octet-stream");
  });
  Client client(fixture.server->port(), 16384);
  client.send(kGet);
  const http::ExchangePtr exchange = fixture.first();
  const std::string piece(4096, 'x');
  std::size_t posted = 0;
  // Post while writable; stop once it stays unwritable (the socket's buffers are full).
  while (posted < (std::size_t{64} << 20)) {
    if (exchange->writable()) {
      exchange->stream_write(piece);
      posted += piece.size();
    } else if (!eventually([&] { return exchange->writable(); }, milliseconds(200))) {
      break;
    }
  }
  REQUIRE(posted < (std::size_t{64} << 20));
  CHECK_FALSE(exchange->writable());
  CHECK(exchange->backlog() >= std::size_t{64} << 10);
  CHECK(exchange->backlog() <= posted + 1024);  // the chunk framing and the head, at most
  // The client reads everything posted: nothing is left unsent.
  std::string received;
  const bool drained = eventually(
      [&] {
        if (exchange->backlog() == 0) return true;
        client.read_some(received);
        return exchange->backlog() == 0;
      },
      milliseconds(5000));
  CHECK(drained);
  CHECK(exchange->backlog() == 0);
  CHECK(exchange->writable());
  exchange->stream_end();
  received += client.read_until("0\r\n\r\n");
  CHECK(received.size() > posted);
  CHECK(fixture.cancels == 0);
}

TEST_CASE("a stream that stops being read past server.timeout is cut and cancelled") {
  http::ServerOptions options;
  options.timeout = 0.3;
  Fixture fixture(
      false,
      [](const http::ExchangePtr& exchange) {
        exchange->stream_begin(200, "application/octet-stream");
        const std::string piece(std::size_t{1} << 20, 'x');
        for (int i = 0; i < 16; ++i) exchange->stream_write(piece);
      },
      options);
  Client client(fixture.server->port(), 16384);
  client.send(kGet);
  // 0.3 s after the last byte moved; the bound is generous for a sanitized build on a busy
  // machine (CI's ASan pass once missed 3 s).
  REQUIRE(eventually([&] { return fixture.cancels == 1; }, milliseconds(10000)));
  CHECK(fixture.closed());
}

TEST_CASE("requests pipelined behind a stream answered on the loop are served in order") {
  Fixture fixture(true, [](const http::ExchangePtr& exchange) {
    if (exchange->request().head.target == "/plain") return exchange->respond(text("after"));
    begin_events(exchange);
    exchange->stream_end();
  });
  Client client(fixture.server->port());
  client.send(std::string(kGet) + "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n" + kGet);
  const std::string response = client.read_until("0\r\n\r\n", 2);
  const std::size_t first_end = response.find("0\r\n\r\n");
  const std::size_t plain = response.find("after");
  CHECK(first_end != std::string::npos);
  CHECK(plain > first_end);
  CHECK(response.find("data: 0", plain) != std::string::npos);
  CHECK(fixture.cancels == 0);
}

TEST_CASE("many events posted in one loop round leave in one write, not one each") {
  constexpr int kEvents = 200;
  Fixture fixture(false, [](const http::ExchangePtr& exchange) {
    exchange->stream_begin(200, "text/event-stream");
    for (int i = 0; i < kEvents; ++i) exchange->stream_write("data: " + std::to_string(i) + "\n\n");
    exchange->stream_end();
  });
  Client client(fixture.server->port());
  const std::uint32_t before = client.segments_in();
  client.send(kGet);
  const std::string response = client.read_until("0\r\n\r\n");
  CHECK(response.find("data: 199\n\n") != std::string::npos);
  // With TCP_NODELAY each write() is a segment of its own on loopback: one write per event
  // would be 200 or more. One flush is a few segments, plus the request's acknowledgement.
  CHECK(client.segments_in() - before < 20);
}

TEST_CASE("aborting the server cancels its streams on the loop thread") {
  Fixture fixture(true, begin_events);
  Client client(fixture.server->port());
  client.send(kGet);
  CHECK(client.read_until("data: 0\n\n").find("HTTP/1.1 200 OK") == 0);
  const http::ExchangePtr exchange = fixture.first();
  fixture.server->abort();
  CHECK(fixture.cancels == 1);
  CHECK(fixture.cancelled_on.load() != std::this_thread::get_id());
  exchange->stream_write("data: 1\n\n");  // after the server: nowhere, and no crash
  bool late = false;
  exchange->on_cancel([&] { late = true; });  // already set: ignored
  CHECK_FALSE(late);
  CHECK(fixture.cancels == 1);
}
