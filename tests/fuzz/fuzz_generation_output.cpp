// Fuzz target: a generation message from an engine, frames and all, and the ADD and ABORT
// payloads an engine decodes. The input is split into frames: the first byte's low two bits
// give the number of extra frames, each then prefixed by one length byte; the rest is frame 0.
// Every decoder must answer with a value or an error string, and every view it returns must
// read only inside the frames (ASan checks each element read below). Outputs are read in
// place, not through msgpack-c: whatever they accept must be msgpack that msgpack-c accepts.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/wire/generation_output.hpp"
#include "common/wire/generation_request.hpp"

namespace {

double touch(const vllmd::wire::LogprobsView& view) {
  double sum = 0;
  for (std::size_t i = 0; i < view.token_ids.size(); ++i) {
    sum += static_cast<double>(view.token_ids.integer(i)) + view.logprobs.real(i);
  }
  for (std::size_t i = 0; i < view.ranks.size(); ++i) sum += view.ranks.real(i);
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace wire = vllmd::wire;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.empty()) return 0;
  const int extra = static_cast<unsigned char>(input[0]) & 3;
  input.remove_prefix(1);
  std::vector<std::string_view> frames(1);
  for (int i = 0; i < extra && !input.empty(); ++i) {
    const std::size_t length =
        std::min<std::size_t>(static_cast<unsigned char>(input[0]), input.size() - 1);
    frames.push_back(input.substr(1, length));
    input.remove_prefix(1 + length);
  }
  frames[0] = input;
  volatile double sink = 0;
  if (auto decoded = wire::decode_outputs(frames)) {
    // The in-place reader accepts only well-formed msgpack: the tree decoder reads it too
    // (with room for the depth the reader counts from each skipped field, not the frame).
    wire::DecodeLimits deep;
    deep.depth = 1024;
    if (!wire::decode(frames[0], deep)) __builtin_trap();
    for (const wire::OutputView& output : decoded->outputs) {
      for (const std::int64_t token : output.new_token_ids) {
        sink = sink + static_cast<double>(token);
      }
      if (output.logprobs) sink = sink + touch(*output.logprobs);
      if (output.prompt_logprobs) sink = sink + touch(*output.prompt_logprobs);
    }
  }
  for (const wire::RequestLayout& layout : wire::request_layouts()) {
    (void)wire::decode_engine_core_request(frames[0], layout);
  }
  (void)wire::decode_abort(frames[0]);
  return 0;
}
