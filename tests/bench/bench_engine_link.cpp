// bench_engine_link: figures for the engine link, printed, never checked. It measures
//  - UTILITY round trips through EngineClient to vllm-ref-engine processes over tcp loopback:
//    one sequential caller, 4 and 16 concurrent callers, and a DP=2 fan-out (call_all);
//  - wire::json_to_msgpack on a ~40 MB update_info body shaped like an 8-GPU trainer's
//    unpacked IPC handles (payloads.hpp), against a plain memcpy of the same bytes;
//  - that update_info sent end to end as collective_rpc update_weights to an IPC engine.
//
// Usage: bench_engine_link [--quick]
// Not a test: it is built with the tests but not registered with CTest.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <functional>
#include <latch>
#include <memory>
#include <msgpack.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/engine/client.hpp"
#include "common/util/log.hpp"
#include "common/wire/json_to_msgpack.hpp"
#include "tests/bench/payloads.hpp"
#include "tests/support/process.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using vllmd::engine::CallOptions;
using vllmd::engine::EngineClient;
using vllmd::engine::EngineReply;
using vllmd::testing::ChildProcess;

constexpr double kMega = 1e6;  // MB = 10^6 bytes throughout

struct Config {
  bool quick = false;
  int warmup_calls = 1000;
  int sequential_calls = 20000;
  int concurrent_calls = 20000;  // in total, split evenly over the callers
  int fanout_calls = 10000;
  int transcode_runs = 7;
  int update_runs = 5;
  // No phase may run longer than this, whatever the machine: the program stays bounded.
  Clock::duration phase_cap = 10s;
};

Config quick_config() {
  Config config;
  config.quick = true;
  config.warmup_calls = 200;
  config.sequential_calls = 2000;
  config.concurrent_calls = 2000;
  config.fanout_calls = 1000;
  config.transcode_runs = 5;
  config.update_runs = 5;
  config.phase_cap = 5s;
  return config;
}

// ---------------------------------------------------------------------------------------------
// Formatting

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// Other work on the machine skews every figure: say how busy it was.
std::string load_average() {
  std::FILE* file = std::fopen("/proc/loadavg", "r");
  if (file == nullptr) return "unknown";
  double one = 0, five = 0, fifteen = 0;
  const int read = std::fscanf(file, "%lf %lf %lf", &one, &five, &fifteen);
  std::fclose(file);
  if (read != 3) return "unknown";
  return fixed(one, 2) + " " + fixed(five, 2) + " " + fixed(fifteen, 2) + " (1/5/15 min)";
}

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &parts);
  return text;
}

// A small text table; `align` holds 'l' or 'r' per column.
class Table {
 public:
  Table(std::string align, std::vector<std::string> header) : align_(std::move(align)) {
    rows_.push_back(std::move(header));
  }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  void print() const {
    std::vector<std::size_t> widths(align_.size(), 0);
    for (const auto& row : rows_) {
      for (std::size_t i = 0; i < row.size() && i < widths.size(); ++i) {
        widths[i] = std::max(widths[i], row[i].size());
      }
    }
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      print_row(rows_[r], widths);
      if (r == 0) {
        std::vector<std::string> rule;
        rule.reserve(widths.size());
        for (std::size_t width : widths) rule.emplace_back(width, '-');
        print_row(rule, widths);
      }
    }
  }

 private:
  void print_row(const std::vector<std::string>& row,
                 const std::vector<std::size_t>& widths) const {
    std::string line = "  ";
    for (std::size_t i = 0; i < widths.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      const std::string pad(widths[i] - cell.size(), ' ');
      if (i > 0) line += "  ";
      line += align_[i] == 'l' ? cell + pad : pad + cell;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::puts(line.c_str());
  }

  std::string align_;
  std::vector<std::vector<std::string>> rows_;
};

// ---------------------------------------------------------------------------------------------
// Statistics

double micros(Clock::duration duration) {
  return std::chrono::duration<double, std::micro>(duration).count();
}

double seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

// Nearest-rank percentile (q in [0, 1]) of ascending samples.
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return percentile(samples, 0.5);
}

// ---------------------------------------------------------------------------------------------
// Engines

// The client goes first (declared last), so it never sees its engines die.
struct Rig {
  std::vector<ChildProcess> engines;
  std::unique_ptr<EngineClient> client;

  void stop() {
    client.reset();
    for (ChildProcess& engine : engines) engine.kill_and_reap();
    engines.clear();
  }
};

// A client on tcp loopback and `dp` engine processes, all handshaken. Backend ipc: the
// update_info phase needs it, and plain utility calls do not care.
Rig start_rig(int dp) {
  Rig rig;
  vllmd::engine::ClientOptions options;
  options.handshake_address = "tcp://127.0.0.1:0";
  options.data_parallel_size = dp;
  auto client = EngineClient::create(std::move(options));
  if (!client) throw std::runtime_error("cannot create the engine client: " + client.error());
  rig.client = std::move(*client);
  for (int rank = 0; rank < dp; ++rank) {
    rig.engines.emplace_back(std::vector<std::string>{
        VLLM_REF_ENGINE_PATH, "--handshake", rig.client->handshake_endpoint(), "--rank",
        std::to_string(rank), "--tp", "1", "--dp", std::to_string(dp), "--backend", "ipc",
        "--log-level", "warning"});
  }
  if (!rig.client->wait_all_ready(20s)) {
    throw std::runtime_error("engines not ready within 20 s (dp " + std::to_string(dp) + ")");
  }
  return rig;
}

// ---------------------------------------------------------------------------------------------
// Round trips

const EngineClient::ArgParts kNoArgs = {std::string_view("\x90", 1)};  // msgpack []
const CallOptions kUtilityCall{5s, false};

// One call; false with the reason when it failed.
using CallOnce = std::function<bool(std::string& error)>;

struct LatencyResult {
  std::vector<double> micros;  // successful calls, ascending
  std::size_t errors = 0;
  std::string first_error;
  double seconds = 0;  // wall time of the whole run

  double calls_per_second() const {
    return seconds > 0 ? static_cast<double>(micros.size()) / seconds : 0;
  }
};

// `callers` threads, each making up to `per_caller` calls back to back, all released at once.
LatencyResult run_callers(int callers, int per_caller, Clock::duration cap,
                          const CallOnce& call_once) {
  std::vector<std::vector<double>> samples(callers);
  std::vector<std::size_t> errors(callers, 0);
  std::vector<std::string> first_errors(callers);
  std::latch start(callers + 1);
  const Clock::time_point deadline = Clock::now() + cap;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(callers));
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      std::vector<double>& mine = samples[c];
      mine.reserve(per_caller);
      std::string error;
      start.arrive_and_wait();
      for (int i = 0; i < per_caller; ++i) {
        const Clock::time_point began = Clock::now();
        if (began >= deadline) break;
        const bool ok = call_once(error);
        const Clock::time_point ended = Clock::now();
        if (ok) {
          mine.push_back(micros(ended - began));
        } else if (errors[c]++ == 0) {
          first_errors[c] = error;
        }
      }
    });
  }
  start.arrive_and_wait();
  const Clock::time_point began = Clock::now();
  for (std::thread& thread : threads) thread.join();
  LatencyResult result;
  result.seconds = seconds(Clock::now() - began);
  for (int c = 0; c < callers; ++c) {
    result.micros.insert(result.micros.end(), samples[c].begin(), samples[c].end());
    result.errors += errors[c];
    if (result.first_error.empty()) result.first_error = first_errors[c];
  }
  std::sort(result.micros.begin(), result.micros.end());
  return result;
}

CallOnce call_one(EngineClient& client) {
  return [&client](std::string& error) {
    const EngineReply reply = client.call(0, "get_weight_version", kNoArgs, kUtilityCall);
    if (reply.value) return true;
    error = reply.value.error().message;
    return false;
  };
}

CallOnce call_all(EngineClient& client) {
  return [&client](std::string& error) {
    for (const EngineReply& reply : client.call_all("get_weight_version", kNoArgs, kUtilityCall)) {
      if (!reply.value) {
        error = "rank " + std::to_string(reply.rank) + ": " + reply.value.error().message;
        return false;
      }
    }
    return true;
  };
}

void add_latency_row(Table& table, const std::string& name, const LatencyResult& result,
                     std::vector<std::string>& notes) {
  table.add({name, std::to_string(result.micros.size()), std::to_string(result.errors),
             fixed(percentile(result.micros, 0.50), 1), fixed(percentile(result.micros, 0.99), 1),
             fixed(result.calls_per_second(), 0)});
  if (result.errors > 0) notes.push_back(name + ": first error: " + result.first_error);
}

// ---------------------------------------------------------------------------------------------
// Throughput

struct Throughput {
  int runs = 0;
  double median_seconds = 0;
};

Throughput time_memcpy(std::string_view body, int runs) {
  std::unique_ptr<char[]> target(new char[body.size()]);
  std::memset(target.get(), 0, body.size());  // fault the pages in: time the copy alone
  std::vector<double> times;
  for (int run = 0; run < runs; ++run) {
    const Clock::time_point began = Clock::now();
    std::memcpy(target.get(), body.data(), body.size());
    times.push_back(seconds(Clock::now() - began));
  }
  // Reading the copy back keeps the compiler from dropping it.
  if (std::memcmp(target.get(), body.data(), body.size()) != 0) {
    throw std::runtime_error("memcpy mismatch");
  }
  return {runs, median(times)};
}

// Each run transcodes into a fresh buffer, as a request does; the last result is kept.
Throughput time_transcode(std::string_view body, int runs, vllmd::wire::Transcoded& last) {
  std::vector<double> times;
  for (int run = 0; run < runs; ++run) {
    const Clock::time_point began = Clock::now();
    auto transcoded = vllmd::wire::json_to_msgpack(body);
    times.push_back(seconds(Clock::now() - began));
    if (!transcoded) {
      throw std::runtime_error("json_to_msgpack failed: " + transcoded.error().describe());
    }
    last = std::move(*transcoded);
  }
  return {runs, median(times)};
}

std::string transcode_small(std::string_view json) {
  auto transcoded = vllmd::wire::json_to_msgpack(json);
  if (!transcoded) throw std::runtime_error("bad JSON: " + transcoded.error().describe());
  return transcoded->msgpack.str();
}

struct UpdateResult {
  Throughput timing;
  int succeeded = 0;
  std::string first_error;
};

// start_weight_update, then the timed update_weights carrying the whole update_info, then
// finish_weight_update; a failed update abandons the session on the engine, so each run
// starts a fresh one.
UpdateResult time_update_calls(EngineClient& client, std::string_view update_info, int runs) {
  msgpack::sbuffer header;
  msgpack::packer<msgpack::sbuffer> packer(header);
  packer.pack_array(4);
  packer.pack(std::string("update_weights"));
  packer.pack_nil();
  packer.pack_array(0);
  packer.pack_map(1);
  packer.pack(std::string("update_info"));
  // The value goes out straight from the transcoded body, as the daemon sends it.
  const EngineClient::ArgParts update_args = {std::string_view(header.data(), header.size()),
                                              update_info};
  const std::string start_args = transcode_small(R"(["start_weight_update",null,[],{}])");
  const std::string finish_args = transcode_small(R"(["finish_weight_update",null,[],{}])");
  const std::string one_worker_none("\x91\xc0", 2);  // [None] from the single TP worker

  UpdateResult result;
  std::vector<double> times;
  const auto note = [&](std::string_view step, const EngineReply& reply) {
    if (!result.first_error.empty()) return;
    result.first_error =
        std::string(step) + ": " + (reply.value ? "unexpected reply" : reply.value.error().message);
  };
  for (int run = 0; run < runs; ++run) {
    const EngineReply started = client.call(0, "collective_rpc", {start_args}, kUtilityCall);
    if (!started.value || *started.value != one_worker_none) {
      note("start_weight_update", started);
      continue;
    }
    const Clock::time_point began = Clock::now();
    const EngineReply updated =
        client.call(0, "collective_rpc", update_args, CallOptions{60s, true});
    times.push_back(seconds(Clock::now() - began));
    if (!updated.value || *updated.value != one_worker_none) {
      note("update_weights", updated);
      continue;
    }
    const EngineReply finished = client.call(0, "collective_rpc", {finish_args}, kUtilityCall);
    if (!finished.value || *finished.value != one_worker_none) {
      note("finish_weight_update", finished);
      continue;
    }
    ++result.succeeded;
  }
  result.timing = {static_cast<int>(times.size()), times.empty() ? 0 : median(times)};
  return result;
}

// ---------------------------------------------------------------------------------------------

int run(const Config& config) {
  const Clock::time_point program_began = Clock::now();
  vllmd::util::log::set_level(vllmd::util::log::Level::kWarning);  // the client's handshake chatter
  std::printf("bench_engine_link: vllmd engine link figures\n");
  std::printf("  date    %s\n", utc_now().c_str());
  std::printf("  cores   %u (hardware_concurrency)\n", std::thread::hardware_concurrency());
  std::printf("  load    %s\n", load_average().c_str());
  std::printf("  mode    %s\n", config.quick ? "quick" : "full");
  std::printf("  engine  vllm-ref-engine processes (backend ipc, tp 1), tcp://127.0.0.1\n\n");

  // 1. UTILITY round trips.
  std::vector<std::string> notes;
  Table calls("lrrrrr",
              {"get_weight_version [] (0x90)", "calls", "errors", "p50 us", "p99 us", "calls/s"});
  Rig single = start_rig(1);
  EngineClient& client = *single.client;
  // Warm-up: connections, the client's engine-to-output mapping, caches, CPU clocks.
  run_callers(1, config.warmup_calls, config.phase_cap, call_one(client));
  add_latency_row(calls, "1 caller, sequential",
                  run_callers(1, config.sequential_calls, config.phase_cap, call_one(client)),
                  notes);
  for (int callers : {4, 16}) {
    add_latency_row(
        calls, std::to_string(callers) + " concurrent callers",
        run_callers(callers, config.concurrent_calls / callers, config.phase_cap, call_one(client)),
        notes);
  }
  {
    Rig pair = start_rig(2);
    run_callers(1, config.warmup_calls, config.phase_cap, call_all(*pair.client));
    add_latency_row(calls, "DP=2 call_all, sequential",
                    run_callers(1, config.fanout_calls, config.phase_cap, call_all(*pair.client)),
                    notes);
    pair.stop();
  }
  std::printf(
      "UTILITY round trip through EngineClient (latency per call; call_all waits for both)\n");
  calls.print();
  for (const std::string& line : notes) std::printf("  ! %s\n", line.c_str());
  std::printf("\n");

  // 2. Transcoding, and the whole update_info through the client.
  const Clock::time_point generation_began = Clock::now();
  const vllmd::bench::Body body = vllmd::bench::ipc_update_body(vllmd::bench::kMoe30B);
  const double generation_seconds = seconds(Clock::now() - generation_began);
  const double json_mb = static_cast<double>(body.json.size()) / kMega;

  const Throughput copy = time_memcpy(body.json, config.transcode_runs);
  vllmd::wire::Transcoded transcoded;
  const Throughput transcode = time_transcode(body.json, config.transcode_runs, transcoded);
  const vllmd::wire::TopLevelMember* member = transcoded.find("update_info");
  if (member == nullptr || member->kind != vllmd::wire::JsonKind::kObject) {
    throw std::runtime_error("transcoded body has no update_info object");
  }
  const std::string_view update_info = transcoded.value_bytes(*member);
  const double msgpack_mb = static_cast<double>(transcoded.msgpack.size()) / kMega;
  const double value_mb = static_cast<double>(update_info.size()) / kMega;
  const UpdateResult update = time_update_calls(client, update_info, config.update_runs);
  single.stop();

  std::printf("update_info: %zu tensors x %d GPUs, %d-char base64 handles (generated in %.0f ms)\n",
              body.tensors, vllmd::bench::kIpcGpus, vllmd::bench::kIpcHandleChars,
              generation_seconds * 1e3);
  std::printf("  JSON body %.2f MB -> msgpack %.2f MB (%.1f%%), update_info value %.2f MB\n",
              json_mb, msgpack_mb, 100.0 * msgpack_mb / json_mb, value_mb);
  Table bulk("lrrrl", {"operation", "runs", "median ms", "MB/s", "MB/s of"});
  const auto rate = [](double mb, double secs) {
    return secs > 0 ? fixed(mb / secs, 0) : std::string("-");
  };
  bulk.add({"memcpy of the body (floor)", std::to_string(copy.runs),
            fixed(copy.median_seconds * 1e3, 2), rate(json_mb, copy.median_seconds), "JSON in"});
  bulk.add({"wire::json_to_msgpack", std::to_string(transcode.runs),
            fixed(transcode.median_seconds * 1e3, 2), rate(json_mb, transcode.median_seconds),
            "JSON in"});
  bulk.add({"update_weights call, end to end", std::to_string(update.timing.runs),
            fixed(update.timing.median_seconds * 1e3, 2),
            rate(value_mb, update.timing.median_seconds), "msgpack sent"});
  bulk.print();
  std::printf("  update_weights via EngineClient::call (collective_rpc, backend ipc): %d/%d %s\n",
              update.succeeded, config.update_runs,
              update.succeeded == config.update_runs ? "succeeded" : "succeeded; FAILED runs");
  if (!update.first_error.empty()) std::printf("  ! %s\n", update.first_error.c_str());
  std::printf("\ntotal %.1f s\n", seconds(Clock::now() - program_began));
  return 0;
}

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: bench_engine_link [--quick]\n"
               "  --quick  fewer iterations (a smoke run)\n");
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--quick") {
      config = quick_config();
    } else if (arg == "-h" || arg == "--help") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "bench_engine_link: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 64;  // EX_USAGE
    }
  }
  try {
    return run(config);
  } catch (const std::exception& error) {
    // Rigs still alive kill and reap their engines while unwinding.
    std::fprintf(stderr, "bench_engine_link: %s\n", error.what());
    return 1;
  }
}
