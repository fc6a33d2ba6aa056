// make_payload: writes one of the benchmark's /update_weights bodies (payloads.hpp) to a file,
// so the runner, the load generator and the JSON floor all use the very same bytes.
//
// Usage: make_payload KIND FILE     (KIND: nccl-30b, ipc-30b, ipc-235b)
//        make_payload --list
// Prints one JSON line: {"kind":...,"backend":...,"bytes":...,"tensors":...}.

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "tests/bench/payloads.hpp"

namespace {

void usage(std::FILE* out) {
  std::fprintf(out, "usage: make_payload KIND FILE | --list\n  KIND:");
  for (const auto& kind : vllmd::bench::payload_kinds()) {
    std::fprintf(out, " %.*s", static_cast<int>(kind.name.size()), kind.name.data());
  }
  std::fprintf(out, "\n");
}

int run(int argc, char** argv) {
  if (argc == 2 && std::string_view(argv[1]) == "--list") {
    for (const auto& kind : vllmd::bench::payload_kinds()) {
      std::printf("%.*s %.*s\n", static_cast<int>(kind.name.size()), kind.name.data(),
                  static_cast<int>(kind.backend.size()), kind.backend.data());
    }
    return 0;
  }
  if (argc == 2 && (std::string_view(argv[1]) == "-h" || std::string_view(argv[1]) == "--help")) {
    usage(stdout);
    return 0;
  }
  if (argc != 3) {
    usage(stderr);
    return 64;  // EX_USAGE
  }
  const std::string_view wanted = argv[1];
  for (const auto& kind : vllmd::bench::payload_kinds()) {
    if (kind.name != wanted) continue;
    const vllmd::bench::Body body = kind.make();
    std::FILE* file = std::fopen(argv[2], "wb");
    if (file == nullptr) {
      std::perror(argv[2]);
      return 73;  // EX_CANTCREAT
    }
    const bool written =
        std::fwrite(body.json.data(), 1, body.json.size(), file) == body.json.size();
    if (std::fclose(file) != 0 || !written) {
      std::fprintf(stderr, "make_payload: cannot write %s\n", argv[2]);
      return 74;  // EX_IOERR
    }
    std::printf(R"({"kind":"%s","backend":"%.*s","bytes":%zu,"tensors":%zu})"
                "\n",
                argv[1], static_cast<int>(kind.backend.size()), kind.backend.data(),
                body.json.size(), body.tensors);
    return 0;
  }
  std::fprintf(stderr, "make_payload: unknown kind '%s'\n", argv[1]);
  usage(stderr);
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "make_payload: %s\n", error.what());
    return 1;
  }
}
