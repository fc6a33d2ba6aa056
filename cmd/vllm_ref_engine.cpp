// vllm-ref-engine: the reference engine as a process, standing in for a headless
// `vllm serve` in tests. It connects to a frontend's handshake address and serves UTILITY
// calls with vLLM's weight-update semantics; fault flags provoke every failure mode.

#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/api/errors.hpp"
#include "common/reference/engine.hpp"
#include "common/reference/model_loader.hpp"
#include "common/util/log.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace {

using vllmd::reference::ReceivedCall;
using vllmd::reference::ReferenceEngineOptions;

struct Flags {
  ReferenceEngineOptions options;
  std::string backend = "nccl";
  std::vector<std::string> fail;
  std::vector<std::string> fail_once;
  std::vector<std::string> delay;  // METHOD=SECONDS
  std::vector<std::string> hold;   // METHOD=SECONDS
  double dp_group_timeout = 30;    // seconds
  std::vector<std::string> exit_silently;
  std::vector<std::string> garbage;
  std::vector<std::string> send_dead;
  std::string record;
  std::string log_level = "info";
  double delay_ready = 0;  // seconds
  double step_ms = 5;      // milliseconds
  std::string model;       // a Hugging Face Llama directory: generate from it
  std::string load_format = "auto";
  bool max_model_len_given = false;
};

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

// Splits METHOD=SECONDS; false when malformed.
bool parse_method_seconds(const std::string& text, std::string& method,
                          std::chrono::milliseconds& duration) {
  const std::size_t equals = text.rfind('=');
  if (equals == std::string::npos || equals == 0) return false;
  const std::string seconds_text = text.substr(equals + 1);
  char* end = nullptr;
  const double seconds = std::strtod(seconds_text.c_str(), &end);
  if (seconds_text.empty() || *end != '\0' || !std::isfinite(seconds) || seconds < 0 ||
      seconds > 86400.0 * 365) {
    return false;
  }
  method = text.substr(0, equals);
  duration = millis(seconds);
  return true;
}

CLI::Validator method_seconds() {
  return CLI::Validator(
      [](std::string& text) {
        std::string method;
        std::chrono::milliseconds duration;
        return parse_method_seconds(text, method, duration)
                   ? std::string()
                   : "expected METHOD=SECONDS, got '" + text + "'";
      },
      "");
}

void add_method_seconds(std::map<std::string, std::chrono::milliseconds>& faults,
                        const std::vector<std::string>& texts) {
  for (const std::string& text : texts) {
    std::string method;
    std::chrono::milliseconds duration{};
    parse_method_seconds(text, method, duration);  // validated by the flag's check
    faults[method] = duration;
  }
}

void add_parallel_size(CLI::App& app, const std::string& name, int& size, const std::string& help) {
  app.add_option(name, size, help)->type_name("N")->check(CLI::Range(1, 1024));
}

void define_engine_flags(CLI::App& app, Flags& flags) {
  ReferenceEngineOptions& options = flags.options;
  app.add_option("--handshake", options.handshake_address,
                 "Frontend handshake address (tcp://host:port or ipc:///path)")
      ->required()
      ->type_name("ADDR");
  app.add_option("--rank", options.rank, "Data-parallel rank (engine identity)")
      ->type_name("R")
      ->check(CLI::Range(0, 65535));
  add_parallel_size(app, "--tp", options.tensor_parallel_size, "Tensor-parallel size");
  add_parallel_size(app, "--pp", options.pipeline_parallel_size, "Pipeline-parallel size");
  add_parallel_size(app, "--pcp", options.prefill_context_parallel_size,
                    "Prefill-context-parallel size (workers per engine: PP x TP x PCP)");
  app.add_option("--dp", options.data_parallel_size, "Data-parallel size")
      ->type_name("N")
      ->check(CLI::Range(1, 65536));
  app.add_flag("--coordinated-dp", options.coordinated_dp,
               "Coordinated (MoE) DP: form the DP group at INIT's DP master before READY");
  app.add_option("--dp-group-timeout", flags.dp_group_timeout,
                 "How long the DP group may take to form, in seconds")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--backend", flags.backend, "Weight transfer backend")
      ->type_name("BACKEND")
      ->check(CLI::IsMember({"nccl", "ipc", "tcp", "none"}))
      ->capture_default_str();
  app.add_flag("!--no-insecure-serialization", options.insecure_serialization,
               "Refuse pickled IPC handles, as vLLM does without "
               "VLLM_ALLOW_INSECURE_SERIALIZATION=1");
  app.add_option("--running-requests", options.running_requests,
                 "Fake requests holding KV blocks (no client, no output) until a pause (abort or "
                 "wait) or a sleep ends them: reset_prefix_cache then declines unless "
                 "reset_running_requests")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-num-seqs", options.max_num_seqs,
                 "Requests generated for at once; the rest wait, first come first served")
      ->type_name("N")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--tokens-per-step", options.tokens_per_step,
                 "Tokens per running request per step (as with speculative decoding)")
      ->type_name("N")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--step-ms", flags.step_ms,
                 "Time between steps while requests run, in milliseconds (0: back to back)")
      ->type_name("MS")
      ->check(CLI::Range(0.0, 60000.0))
      ->capture_default_str();
  app.add_option("--vocab-size", options.vocab_size, "Tokens are drawn from 0 to N-1")
      ->type_name("N")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 31))
      ->capture_default_str();
  app.add_option("--zero-copy-threshold", options.zero_copy_threshold,
                 "Logprob arrays of at least BYTES go in extra frames, smaller ones inline "
                 "(VLLM_MSGPACK_ZERO_COPY_THRESHOLD)")
      ->type_name("BYTES")
      ->capture_default_str();
  app.add_option("--vllm-version", options.vllm_version, "vllm_version in the registration")
      ->type_name("STR")
      ->capture_default_str();
  app.add_option("--max-model-len", options.max_model_len,
                 "max_model_len in the registration: the longest prompt plus output")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--model", flags.model,
                 "Generate from the Llama model in DIR (config.json and safetensors weights; "
                 "without it, tokens follow the documented formula)")
      ->type_name("DIR");
  app.add_option("--load-format", flags.load_format,
                 "How --model's weights load: auto or safetensors (the directory's files), dummy "
                 "(seeded random, as vLLM's dummy loader)")
      ->type_name("FORMAT")
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}))
      ->capture_default_str();
  app.add_option("--log-level", flags.log_level, "trace|debug|info|notice|warning|error")
      ->type_name("LEVEL")
      ->check(CLI::Validator(
          [](std::string& text) {
            vllmd::util::log::Level level;
            return vllmd::util::log::parse_level(text, level) ? std::string()
                                                              : "unknown log level '" + text + "'";
          },
          ""))
      ->capture_default_str();
  app.add_option("--record", flags.record,
                 "Append one JSON line per received call, ADD and ABORT (and the DP group) to FILE")
      ->type_name("FILE");
}

constexpr const char* kFaults = "Fault injection";

// A repeatable fault flag naming a method (METHOD) or a method and a time (METHOD=SECONDS).
CLI::Option* add_fault_list(CLI::App& app, const std::string& name, std::vector<std::string>& list,
                            const std::string& help, bool with_seconds = false) {
  CLI::Option* option = app.add_option(name, list, help);
  if (with_seconds) option->check(method_seconds());
  return option->type_name(with_seconds ? "METHOD=SECONDS" : "METHOD")
      ->allow_extra_args(false)
      ->group(kFaults);
}

void define_fault_flags(CLI::App& app, Flags& flags) {
  ReferenceEngineOptions& options = flags.options;
  add_fault_list(app, "--inject-fail", flags.fail,
                 "Reply with a failure to METHOD; \"generate\" ends every request with "
                 "finish_reason error (repeatable)");
  add_fault_list(app, "--inject-fail-once", flags.fail_once,
                 "Reply with a failure to the first call of METHOD only (repeatable)");
  add_fault_list(app, "--inject-delay", flags.delay,
                 "Block the engine for SECONDS before serving METHOD: METHOD=SECONDS (repeatable)",
                 true);
  add_fault_list(app, "--inject-hold", flags.hold,
                 "Answer METHOD SECONDS after it arrived, serving other calls meanwhile: "
                 "METHOD=SECONDS (repeatable)",
                 true);
  add_fault_list(app, "--inject-exit", flags.exit_silently,
                 "Exit without replying to METHOD (repeatable)");
  add_fault_list(app, "--inject-garbage", flags.garbage,
                 "Send malformed output frames before replying to METHOD (repeatable)");
  add_fault_list(app, "--inject-dead", flags.send_dead,
                 "Send ENGINE_CORE_DEAD and exit on METHOD (repeatable)");
  app.add_option("--reply-fields", options.faults.reply_fields,
                 "EngineCoreOutputs length: 8 (as msgspec writes it) or 5")
      ->type_name("5|8")
      ->check(CLI::IsMember({5, 8}))
      ->capture_default_str()
      ->group(kFaults);
  app.add_flag("--empty-registration", options.faults.empty_registration,
               "Send an empty registration frame, as older engines do")
      ->group(kFaults);
  app.add_flag("--ready-first", options.faults.ready_before_registration,
               "Send READY before the registration frame")
      ->group(kFaults);
  app.add_option("--delay-ready", flags.delay_ready,
                 "Wait SECONDS after INIT before registering and sending READY (a model load)")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 86400.0))
      ->group(kFaults);
}

// Appends each received call to a file as one JSON line (and the DP group, once formed),
// flushed at once so a test can read it while the engine runs (and after it was killed).
// Steady-clock seconds, as the engine times its steps: "at" of every recorded line.
std::string now_text() {
  char text[32];
  std::snprintf(
      text, sizeof text, "%.6f",
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
  return text;
}

class Recorder {
 public:
  explicit Recorder(std::FILE* file) : file_(file) {}
  ~Recorder() {
    if (file_ != nullptr) std::fclose(file_);
  }
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  void write(const ReceivedCall& call) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string line =
        "{\"at\":" + now_text() + ",\"method\":" + vllmd::wire::json_string(call.method);
    line += ",\"worker_method\":";
    line += call.worker_method.empty() ? "null" : vllmd::wire::json_string(call.worker_method);
    line += ",\"args\":";
    auto json = vllmd::wire::msgpack_to_json(call.args_msgpack);
    line += json ? *json : "null";
    line += ",\"args_hex\":\"";
    for (const char c : call.args_msgpack) {
      const auto byte = static_cast<unsigned char>(c);
      line.push_back(kHex[byte >> 4]);
      line.push_back(kHex[byte & 0xf]);
    }
    line += "\"}\n";
    append(line);
  }

  // The requests whose first tokens a step sent, and when (see ReferenceEngineOptions).
  void write_first(const std::vector<std::string>& ids, double sent_at) {
    char at[32];
    std::snprintf(at, sizeof at, "%.6f", sent_at);
    std::string line = std::string("{\"at\":") + at + ",\"method\":\"FIRST\",\"args\":[";
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i != 0) line += ',';
      line += vllmd::wire::json_string(ids[i]);
    }
    line += "]}\n";
    append(line);
  }

  // The DP group as this rank formed it: one line of its own, before any call.
  void write(const vllmd::reference::DpGroup& group) {
    std::string ports;
    for (std::int64_t port : group.master.port_list) {
      ports += (ports.empty() ? "" : ",") + std::to_string(port);
    }
    append("{\"dp_group\":{\"rank\":" + std::to_string(group.rank) +
           ",\"size\":" + std::to_string(group.size) +
           ",\"master_ip\":" + vllmd::wire::json_string(group.master.ip) +
           ",\"master_port\":" + std::to_string(group.master.port) + ",\"port_list\":[" + ports +
           "],\"group_port\":" + std::to_string(group.group_port) +
           ",\"master_from_init\":" + (group.master_from_init ? "true" : "false") + "}}\n");
  }

 private:
  void append(const std::string& line) {
    std::lock_guard lock(mutex_);
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }

  std::mutex mutex_;
  std::FILE* file_;
};

// --model: the engine generates from it; its vocabulary and (unless given) its context length
// are the ones registered.
bool load_model(Flags& flags) {
  vllmd::reference::LoadFormat format = vllmd::reference::LoadFormat::kAuto;
  vllmd::reference::parse_load_format(flags.load_format, format);
  auto model = vllmd::reference::load_model(flags.model, format);
  if (!model) {
    vllmd::util::log::error("cannot load --model: ", model.error());
    return false;
  }
  const vllmd::reference::LlamaConfig& config = (*model)->config();
  ReferenceEngineOptions& options = flags.options;
  options.vocab_size = config.vocab_size;
  if (!flags.max_model_len_given) options.max_model_len = config.max_position_embeddings;
  options.model = std::move(*model);
  options.model_source = {flags.model, format};
  vllmd::util::log::info(
      "model ", flags.model, ": Llama with ", config.num_hidden_layers, " layers, hidden size ",
      config.hidden_size, ", vocabulary ", config.vocab_size, "; weights ",
      format == vllmd::reference::LoadFormat::kDummy ? "dummy (random)" : "from safetensors");
  return true;
}

// Fills the options the flags describe beyond plain values; false (with a message) on error.
bool finish_options(Flags& flags, std::unique_ptr<Recorder>& recorder) {
  ReferenceEngineOptions& options = flags.options;
  vllmd::reference::parse_backend(flags.backend, options.backend);
  vllmd::util::log::Level level = vllmd::util::log::Level::kInfo;
  vllmd::util::log::parse_level(flags.log_level, level);
  vllmd::util::log::set_level(level);
  options.faults.fail.insert(flags.fail.begin(), flags.fail.end());
  options.faults.fail_once.insert(flags.fail_once.begin(), flags.fail_once.end());
  options.faults.exit_silently.insert(flags.exit_silently.begin(), flags.exit_silently.end());
  options.faults.send_dead.insert(flags.send_dead.begin(), flags.send_dead.end());
  options.faults.garbage.insert(flags.garbage.begin(), flags.garbage.end());
  add_method_seconds(options.faults.delay, flags.delay);
  add_method_seconds(options.faults.hold, flags.hold);
  options.dp_group_timeout = millis(flags.dp_group_timeout);
  options.faults.delay_ready = millis(flags.delay_ready);
  options.step_interval = std::chrono::microseconds(std::llround(flags.step_ms * 1000));
  if (!flags.model.empty() && !load_model(flags)) return false;
  if (!flags.record.empty()) {
    std::FILE* file = std::fopen(flags.record.c_str(), "a");
    if (file == nullptr) {
      vllmd::util::log::error("cannot open --record file ", flags.record);
      return false;
    }
    recorder = std::make_unique<Recorder>(file);
    options.on_call = [raw = recorder.get()](const ReceivedCall& call) { raw->write(call); };
    options.on_dp_group = [raw = recorder.get()](const vllmd::reference::DpGroup& group) {
      raw->write(group);
    };
    options.on_first_outputs = [raw = recorder.get()](const std::vector<std::string>& ids,
                                                      double sent_at) {
      raw->write_first(ids, sent_at);
    };
  }
  // "Exit" in a fault means the process dies, as a crashing vLLM engine would.
  options.on_fault_exit = [] {
    std::fflush(nullptr);
    std::_Exit(1);
  };
  return true;
}

int run(int argc, char** argv) {
  // Every thread inherits this mask; the main thread takes the signals with sigtimedwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  vllmd::util::log::set_component("vllm-ref-engine");

  CLI::App app{"vLLM reference engine: serves vLLM's engine-core protocol for tests"};
  Flags flags;
  define_engine_flags(app, flags);
  define_fault_flags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    app.exit(error);
    return error.get_exit_code() == 0 ? 0 : vllmd::api::exit_code::kUsage;
  }
  flags.max_model_len_given = app.count("--max-model-len") > 0;
  std::unique_ptr<Recorder> recorder;
  if (!finish_options(flags, recorder)) return 1;

  vllmd::reference::ReferenceEngine engine(flags.options);
  engine.start();
  while (engine.running()) {
    const timespec slice{0, 100'000'000};
    const int signal = sigtimedwait(&signals, nullptr, &slice);
    if (signal == SIGTERM || signal == SIGINT) {
      vllmd::util::log::info("signal ", signal, " received; stopping");
      engine.stop();
      return 0;
    }
  }
  engine.wait();
  return engine.error().empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    vllmd::util::log::error(error.what());
    return 1;
  }
}
