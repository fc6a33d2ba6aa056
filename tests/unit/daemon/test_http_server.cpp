// daemon/http/server: the event-loop core over real loopback sockets. Exchanges answered
// later from other threads, streamed responses, pipelining, and requests never lost.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/http/server.hpp"
#include "tests/unit/daemon/loopback_client.hpp"

namespace http = vllmd::daemon::http;

namespace {

using Client = vllmd::test::LoopbackClient;

http::Decision accept_with(std::function<void(http::ExchangePtr)> handler) {
  http::Decision decision;
  decision.body_limit = 1 << 20;
  decision.on_request = std::move(handler);
  return decision;
}

http::Response text(std::string body) {
  http::Response response;
  response.content_type = "text/plain";
  response.body = std::move(body);
  return response;
}

}  // namespace

TEST_CASE("answers given later from another thread reach their own connections") {
  std::mutex mutex;
  std::vector<http::ExchangePtr> pending;
  http::Server server({},
                      [&](const http::RequestHead&, const std::optional<vllmd::util::IpAddress>&) {
                        return accept_with([&](const http::ExchangePtr& exchange) {
                          std::lock_guard lock(mutex);
                          pending.push_back(exchange);
                        });
                      });
  server.start();
  constexpr int kClients = 200;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>(server.port()));
    clients.back()->send("GET /n/" + std::to_string(i) + " HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  for (int waited = 0; waited < 500; ++waited) {
    {
      std::lock_guard lock(mutex);
      if (pending.size() == kClients) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Every request is with the application, and no thread waits for any of them.
  CHECK(server.stats().handling == kClients);
  std::thread answering([&] {
    std::lock_guard lock(mutex);
    for (const http::ExchangePtr& exchange : pending) {
      exchange->respond(text("for " + std::string(exchange->request().head.target)));
    }
    pending.clear();
  });
  answering.join();
  for (int i = 0; i < kClients; ++i) {
    const std::string response =
        clients[static_cast<std::size_t>(i)]->read_until("for /n/" + std::to_string(i));
    CHECK(response.find("HTTP/1.1 200 OK\r\n") == 0);
    CHECK(response.find("for /n/" + std::to_string(i)) != std::string::npos);
  }
}

TEST_CASE("a streamed response is chunked as data arrives, and the connection lives on") {
  http::Server server({},
                      [](const http::RequestHead&, const std::optional<vllmd::util::IpAddress>&) {
                        return accept_with([](const http::ExchangePtr& exchange) {
                          if (exchange->request().head.target == "/plain")
                            return exchange->respond(text("after"));
                          std::thread([exchange] {
                            exchange->stream_begin(200, "text/event-stream");
                            for (int i = 0; i < 3; ++i) {
                              exchange->stream_write("data: " + std::to_string(i) + "\n\n");
                              std::this_thread::sleep_for(std::chrono::milliseconds(20));
                            }
                            exchange->stream_end();
                          }).detach();
                        });
                      });
  server.start();
  Client client(server.port());
  client.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\nGET /plain HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string response = client.read_until("after");
  CHECK(response.find("Transfer-Encoding: chunked\r\n") != std::string::npos);
  CHECK(response.find("Content-Type: text/event-stream\r\n") != std::string::npos);
  CHECK(response.find("9\r\ndata: 0\n\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n") !=
        std::string::npos);
  // Pipelined: the second request is answered after the stream, on the same connection.
  CHECK(response.find("HTTP/1.1 200 OK", response.find("0\r\n\r\n")) != std::string::npos);
}

TEST_CASE("an HTTP/1.0 stream ends by closing the connection") {
  http::Server server({},
                      [](const http::RequestHead&, const std::optional<vllmd::util::IpAddress>&) {
                        return accept_with([](const http::ExchangePtr& exchange) {
                          exchange->stream_begin(200, "text/plain");
                          exchange->stream_write("one ");
                          exchange->stream_write("two");
                          exchange->stream_end();
                        });
                      });
  server.start();
  Client client(server.port());
  client.send("GET / HTTP/1.0\r\n\r\n");
  const std::string response = client.read_all();
  CHECK(response.find("Transfer-Encoding") == std::string::npos);
  CHECK(response.find("Connection: close\r\n") != std::string::npos);
  CHECK(response.substr(response.size() - 7) == "one two");
}

TEST_CASE("an exchange dropped without an answer answers 500 itself") {
  http::Server server({},
                      [](const http::RequestHead&, const std::optional<vllmd::util::IpAddress>&) {
                        return accept_with([](const http::ExchangePtr&) {});
                      });
  server.start();
  Client client(server.port());
  client.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string response = client.read_until("}}");
  CHECK(response.find("HTTP/1.1 500 ") == 0);
  CHECK(response.find("\"code\":\"server_error\"") != std::string::npos);
}

TEST_CASE("a refusal decided from the head drops a small body and serves the next request") {
  std::atomic<int> served{0};
  http::Server server(
      {}, [&](const http::RequestHead& head, const std::optional<vllmd::util::IpAddress>&) {
        if (head.target == "/no") {
          http::Decision refusal;
          refusal.refusal = text("refused");
          refusal.refusal->status = 403;
          return refusal;
        }
        return accept_with([&](const http::ExchangePtr& exchange) {
          ++served;
          exchange->respond(text("body=" + exchange->request().body));
        });
      });
  server.start();
  Client client(server.port());
  client.send(
      "POST /no HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde"
      "POST /yes HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok");
  const std::string response = client.read_until("body=ok");
  CHECK(response.find("HTTP/1.1 403 ") == 0);
  CHECK(response.find("body=ok") != std::string::npos);
  CHECK(served == 1);
}

TEST_CASE("a second server on a port in use fails naming the address") {
  http::Server first({},
                     [](const http::RequestHead&, const std::optional<vllmd::util::IpAddress>&) {
                       return http::Decision{};
                     });
  http::ServerOptions same;
  same.port = first.port();
  try {
    http::Server second(same,
                        [](const http::RequestHead&, const std::optional<vllmd::util::IpAddress>&) {
                          return http::Decision{};
                        });
    FAIL("the second server bound a port in use");
  } catch (const std::runtime_error& error) {
    const std::string message = error.what();
    CHECK(message.find("127.0.0.1:" + std::to_string(first.port())) != std::string::npos);
    CHECK(message.find("in use") != std::string::npos);
  }
}
