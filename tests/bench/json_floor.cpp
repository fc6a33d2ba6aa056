// json_floor: the floor for forwarding an /update_weights body — the time the fastest JSON
// parser available (simdjson) takes for one full pass over the same bytes. Whatever a control
// plane does with the body, it has to read it once; this is that read, done as fast as known.
//
// Two passes are timed, each as the median of --runs runs with a reused parser (a server
// would reuse its buffers too):
//   dom       simdjson::dom::parser::parse: validates everything and builds the tape;
//   ondemand  simdjson::ondemand, walking every value (strings unescaped, numbers parsed).
// The floor is the faster of the two medians. The DOM parser picks its SIMD kernel at run time;
// On Demand is compiled into this program for one target, hence -march=native in CMakeLists.
//
// Usage: json_floor FILE [--runs N]
// Prints one JSON line: {"bytes":..,"runs":..,"dom_s":..,"ondemand_s":..,"floor_s":..,
// "floor_mb_s":..,"dom_implementation":"..","ondemand_implementation":"..",...}.

#include <simdjson.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Touches every value below `value`; the sum keeps the compiler from skipping any of it.
std::uint64_t walk(simdjson::ondemand::value value) {
  std::uint64_t sum = 0;
  switch (value.type().value()) {
    case simdjson::ondemand::json_type::array:
      for (auto element : value.get_array()) sum += walk(element.value());
      return sum + 1;
    case simdjson::ondemand::json_type::object:
      for (auto field : value.get_object()) {
        sum += field.unescaped_key().value().size();
        sum += walk(field.value());
      }
      return sum + 1;
    case simdjson::ondemand::json_type::string: return value.get_string().value().size();
    case simdjson::ondemand::json_type::number:
      return static_cast<std::uint64_t>(value.get_number().value().as_double() != 0);
    case simdjson::ondemand::json_type::boolean: return value.get_bool().value() ? 1 : 0;
    case simdjson::ondemand::json_type::null: return value.is_null() ? 1 : 0;
  }
  return sum;
}

double time_dom(const simdjson::padded_string& json, int runs, std::uint64_t& sink) {
  simdjson::dom::parser parser;
  // The allocation is not part of a pass.
  if (parser.allocate(json.size()) != simdjson::SUCCESS) throw std::runtime_error("out of memory");
  std::vector<double> times;
  for (int run = 0; run < runs; ++run) {
    const Clock::time_point began = Clock::now();
    simdjson::dom::element root = parser.parse(json);
    times.push_back(std::chrono::duration<double>(Clock::now() - began).count());
    sink += root.is_object() ? 1 : 0;
  }
  return median(times);
}

double time_ondemand(const simdjson::padded_string& json, int runs, std::uint64_t& sink) {
  simdjson::ondemand::parser parser;
  if (parser.allocate(json.size()) != simdjson::SUCCESS) throw std::runtime_error("out of memory");
  std::vector<double> times;
  for (int run = 0; run < runs; ++run) {
    const Clock::time_point began = Clock::now();
    simdjson::ondemand::document document = parser.iterate(json);
    sink += walk(document.get_value());
    times.push_back(std::chrono::duration<double>(Clock::now() - began).count());
  }
  return median(times);
}

int run(int argc, char** argv) {
  std::string path;
  int runs = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: json_floor FILE [--runs N]\n");
      return 0;
    } else if (path.empty() && !arg.starts_with("-")) {
      path = arg;
    } else {
      std::fprintf(stderr, "usage: json_floor FILE [--runs N]\n");
      return 64;  // EX_USAGE
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "usage: json_floor FILE [--runs N]\n");
    return 64;
  }
  simdjson::padded_string json = simdjson::padded_string::load(path);
  std::uint64_t sink = 0;
  time_dom(json, 1, sink);  // warm-up: faults the parser's pages in, checks the document
  const double dom = time_dom(json, runs, sink);
  time_ondemand(json, 1, sink);
  const double ondemand = time_ondemand(json, runs, sink);
  const double floor = std::min(dom, ondemand);
  std::printf(
      R"({"bytes":%zu,"runs":%d,"dom_s":%.6f,"ondemand_s":%.6f,"floor_s":%.6f,)"
      R"("floor_mb_s":%.1f,"dom_implementation":"%s","ondemand_implementation":"%s",)"
      R"("checksum":%llu})"
      "\n",
      json.size(), runs, dom, ondemand, floor, static_cast<double>(json.size()) / 1e6 / floor,
      simdjson::get_active_implementation()->name().c_str(),
      SIMDJSON_STRINGIFY(SIMDJSON_BUILTIN_IMPLEMENTATION),  // what this file was compiled for
      static_cast<unsigned long long>(sink));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    // simdjson reports a bad document or an unreadable file by exception.
    std::fprintf(stderr, "json_floor: %s\n", error.what());
    return 1;
  }
}
