// http_load: a closed-loop HTTP/1.1 load generator for the benchmarks. N keep-alive
// connections over loopback each send a fixed sequence of requests (one at a time, the next
// as soon as the previous response is complete) for a bounded time and/or number of
// sequences, and it prints one JSON line with requests/s, latency percentiles, status counts,
// errors, and per-step figures.
//
// Connections are spread over --threads epoll loops (default 1): on a small machine the load
// generator competes with the server for cores, and one loop is the cheapest way to drive
// many connections.
//
// What is counted:
//  - a request is "completed" when its whole response arrived (any status); its latency runs
//    from its first byte written to its last byte read; only requests started after the
//    warm-up are recorded;
//  - requests still waiting for a response at the end are "unfinished" (with the oldest one's
//    age), and connections that completed nothing in the window are "stalled" — a server that
//    leaves connections queued shows up there, not in the percentiles;
//  - a sequence is completed when its last step completed, "ok" when every step was 2xx.
//
// Examples:
//   http_load --port 8000 -c 16 -d 5 -w 1 -r 'GET /weight_info'
//   http_load --port 8000 -n 3 -r 'POST /start_weight_update'
//             -r 'POST /update_weights @body.json' -r 'POST /finish_weight_update'

#include <arpa/inet.h>
#include <netinet/in.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <latch>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/wire/json_text.hpp"
#include "tests/bench/http_loop.hpp"

namespace {

using vllmd::bench::Clock;
using vllmd::bench::Loop;
using vllmd::bench::Plan;
using vllmd::bench::RequestSpec;
using vllmd::bench::Stats;
using vllmd::bench::StepStats;
using vllmd::wire::json_string;

// ---------------------------------------------------------------------------------------------
// The requests

// "METHOD PATH", "METHOD PATH BODY" or "METHOD PATH @FILE". A POST without a body sends
// Content-Length: 0 and no Content-Type, as Python's requests does for start_weight_update.
RequestSpec parse_request(const std::string& text, const std::string& host_header,
                          const std::vector<std::string>& extra_headers) {
  const std::size_t first = text.find(' ');
  if (first == std::string::npos || first == 0) {
    throw std::runtime_error("--request '" + text + "': expected METHOD PATH [BODY|@FILE]");
  }
  const std::size_t second = text.find(' ', first + 1);
  const std::string method = text.substr(0, first);
  const std::string path =
      text.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  if (path.empty() || path.front() != '/') {
    throw std::runtime_error("--request '" + text + "': the path must start with /");
  }
  std::string body_text = second == std::string::npos ? "" : text.substr(second + 1);
  RequestSpec spec;
  spec.label = method + " " + path;
  auto body = std::make_shared<std::string>();
  if (!body_text.empty() && body_text.front() == '@') {
    std::ifstream file(body_text.substr(1), std::ios::binary);
    if (!file) throw std::runtime_error("cannot read " + body_text.substr(1));
    std::ostringstream contents;
    contents << file.rdbuf();
    *body = std::move(contents).str();
    spec.label += " (" + std::to_string(body->size()) + " bytes)";
  } else {
    *body = std::move(body_text);
    if (!body->empty()) spec.label += " " + *body;
  }
  spec.head = method + " " + path + " HTTP/1.1\r\nHost: " + host_header +
              "\r\nUser-Agent: vllmd-http-load\r\nAccept: */*\r\n";
  for (const std::string& header : extra_headers) spec.head += header + "\r\n";
  if (!body->empty()) spec.head += "Content-Type: application/json\r\n";
  if (!body->empty() || method != "GET") {
    spec.head += "Content-Length: " + std::to_string(body->size()) + "\r\n";
  }
  spec.head += "\r\n";
  spec.body = std::move(body);
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Output

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

std::string number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.4f", value);
  return text;
}

std::string latency_json(std::vector<double> micros) {
  std::sort(micros.begin(), micros.end());
  double sum = 0;
  for (const double m : micros) sum += m;
  const double mean = micros.empty() ? 0 : sum / static_cast<double>(micros.size());
  return "{\"p50\":" + number(percentile(micros, 0.50) / 1e3) +
         ",\"p90\":" + number(percentile(micros, 0.90) / 1e3) +
         ",\"p99\":" + number(percentile(micros, 0.99) / 1e3) +
         ",\"p999\":" + number(percentile(micros, 0.999) / 1e3) +
         ",\"max\":" + number(micros.empty() ? 0 : micros.back() / 1e3) +
         ",\"mean\":" + number(mean / 1e3) + "}";
}

std::string status_json(const std::map<int, std::uint64_t>& status) {
  std::string out = "{";
  for (const auto& [code, count] : status) {
    if (out.size() > 1) out += ',';
    out += "\"" + std::to_string(code) + "\":" + std::to_string(count);
  }
  return out + "}";
}

std::uint64_t count_2xx(const std::map<int, std::uint64_t>& status) {
  std::uint64_t ok = 0;
  for (const auto& [code, count] : status) {
    if (code >= 200 && code < 300) ok += count;
  }
  return ok;
}

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  int connections = 1;
  int threads = 1;
  double duration = 10;
  double warmup = 0;
  std::uint64_t iterations = 0;
  std::vector<std::string> requests;
  std::vector<std::string> headers;
  std::string label;
};

std::string report(const Options& options, const Plan& plan, const Stats& stats) {
  const double window =
      std::max(1e-9, std::chrono::duration<double>(stats.finished - plan.measure_from).count());
  StepStats all;
  for (const StepStats& step : stats.steps) all.merge(step);
  const auto completed = all.micros.size();
  std::string out =
      "{\"label\":" + json_string(options.label) +
      ",\"connections\":" + std::to_string(options.connections) +
      ",\"threads\":" + std::to_string(options.threads) + ",\"window_s\":" + number(window) +
      ",\"requests\":" + std::to_string(completed) +
      ",\"rps\":" + number(static_cast<double>(completed) / window) +
      ",\"ok\":" + std::to_string(count_2xx(all.status)) +
      ",\"non_2xx\":" + std::to_string(completed - count_2xx(all.status)) +
      ",\"status\":" + status_json(all.status) +
      ",\"sequences\":" + std::to_string(stats.sequences) +
      ",\"sequences_ok\":" + std::to_string(stats.sequences_ok) +
      ",\"sequences_per_s\":" + number(static_cast<double>(stats.sequences) / window) +
      ",\"errors\":{\"connect\":" + std::to_string(stats.connect_errors) +
      ",\"io\":" + std::to_string(stats.io_errors) +
      ",\"parse\":" + std::to_string(stats.parse_errors) + "}" +
      ",\"reconnects\":" + std::to_string(stats.reconnects) +
      ",\"unfinished\":" + std::to_string(stats.unfinished) +
      ",\"oldest_unfinished_ms\":" + number(stats.oldest_unfinished_us / 1e3) +
      ",\"stalled_connections\":" + std::to_string(stats.stalled_connections) +
      ",\"latency_ms\":" + latency_json(all.micros) + ",\"steps\":[";
  for (std::size_t i = 0; i < stats.steps.size(); ++i) {
    const StepStats& step = stats.steps[i];
    if (i > 0) out += ',';
    out += "{\"request\":" + json_string(plan.requests[i].label) +
           ",\"requests\":" + std::to_string(step.micros.size()) +
           ",\"ok\":" + std::to_string(count_2xx(step.status)) +
           ",\"status\":" + status_json(step.status) +
           ",\"first_error\":" + json_string(step.first_error) +
           ",\"latency_ms\":" + latency_json(step.micros) + "}";
  }
  return out + "]}";
}

int run(int argc, char** argv) {
  CLI::App app{"Closed-loop HTTP/1.1 load over keep-alive connections; prints one JSON line"};
  Options options;
  app.add_option("--host", options.host, "IPv4 address of the server")->capture_default_str();
  app.add_option("--port", options.port, "TCP port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--connections,-c", options.connections, "keep-alive connections")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--threads,-t", options.threads, "epoll loops the connections are spread over")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--duration,-d", options.duration,
                 "seconds measured after the warm-up (an upper bound with --iterations)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup,-w", options.warmup, "seconds run first and not recorded")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--iterations,-n", options.iterations,
                 "sequences per connection, then it closes (0: until the deadline)")
      ->capture_default_str();
  app.add_option("--request,-r", options.requests,
                 "METHOD PATH [BODY|@FILE]; repeat for a sequence each connection cycles through")
      ->required();
  app.add_option("--header,-H", options.headers, "extra request header 'Name: value'");
  app.add_option("--label", options.label, "copied into the output");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    app.exit(error);
    return error.get_exit_code() == 0 ? 0 : 64;
  }
  options.threads = std::min(options.threads, options.connections);

  Plan plan;
  plan.address.sin_family = AF_INET;
  plan.address.sin_port = htons(static_cast<std::uint16_t>(options.port));
  if (inet_pton(AF_INET, options.host.c_str(), &plan.address.sin_addr) != 1) {
    throw std::runtime_error("--host must be an IPv4 address, got '" + options.host + "'");
  }
  plan.iterations = options.iterations;
  const std::string host_header = options.host + ":" + std::to_string(options.port);
  for (const std::string& text : options.requests) {
    plan.requests.push_back(parse_request(text, host_header, options.headers));
  }

  std::vector<std::unique_ptr<Loop>> loops;
  for (int t = 0; t < options.threads; ++t) {
    // Connections are split as evenly as possible.
    const int share =
        options.connections / options.threads + (t < options.connections % options.threads ? 1 : 0);
    loops.push_back(std::make_unique<Loop>(plan, share));
  }
  std::latch go(options.threads + 1);
  std::vector<std::thread> threads;
  threads.reserve(loops.size());
  for (auto& loop : loops) {
    threads.emplace_back([&go, raw = loop.get()] {
      go.arrive_and_wait();
      raw->run();
    });
  }
  const Clock::time_point start = Clock::now();
  plan.measure_from = start + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options.warmup));
  plan.deadline = plan.measure_from + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(options.duration));
  go.arrive_and_wait();
  for (std::thread& thread : threads) thread.join();

  Stats total;
  total.finished = plan.measure_from;
  for (const auto& loop : loops) total.merge(loop->stats());
  std::printf("%s\n", report(options, plan, total).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "http_load: %s\n", error.what());
    return 1;
  }
}
