// Fuzz target: vllmd's HTTP request parser, which reads every byte a client sends. The input
// is a head, then a body. Whatever the parser returns must point into the input, and the
// chunked decoder must give the same result whether the body arrives at once or in pieces
// (as a slow client would send it).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "daemon/http/parser.hpp"

namespace {

using vllmd::daemon::http::ChunkedDecoder;

bool inside(std::string_view part, std::string_view whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

struct Decoded {
  ChunkedDecoder::Status status;
  std::string body;
  std::size_t used = 0;
};

Decoded decode(std::string_view bytes, std::size_t piece) {
  ChunkedDecoder decoder(1 << 16, 1024);
  Decoded result{ChunkedDecoder::Status::kNeedMore, {}, 0};
  while (result.used < bytes.size() && result.status == ChunkedDecoder::Status::kNeedMore) {
    const std::string_view next = bytes.substr(result.used, piece);
    std::size_t consumed = 0;
    result.status = decoder.feed(next, consumed, result.body);
    if (consumed > next.size()) std::abort();
    result.used += consumed;
    if (result.status == ChunkedDecoder::Status::kNeedMore && consumed != next.size()) std::abort();
  }
  if (result.body.size() > (1u << 16) || decoder.decoded() != result.body.size()) std::abort();
  return result;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t end = vllmd::daemon::http::find_head_end(input);
  if (end == std::string_view::npos) return 0;
  if (end > input.size()) std::abort();
  const std::string_view head_bytes = input.substr(0, end);
  const auto head = vllmd::daemon::http::parse_head(head_bytes);
  if (!head) {
    const int status = head.error().status;
    if (status != 400 && status != 417 && status != 431 && status != 501 && status != 505)
      std::abort();
    return 0;
  }
  if (!inside(head->method, head_bytes) || !inside(head->target, head_bytes)) std::abort();
  for (const auto& field : head->fields) {
    if (!inside(field.name, head_bytes) || !inside(field.value, head_bytes)) std::abort();
  }
  if (head->framing != vllmd::daemon::http::BodyFraming::kChunked) return 0;
  const std::string_view body = input.substr(end);
  const Decoded whole = decode(body, body.size() + 1);
  const Decoded bytewise = decode(body, 1);
  const Decoded odd = decode(body, 7);
  for (const Decoded* other : {&bytewise, &odd}) {
    if (other->status != whole.status) std::abort();
    if (whole.status != ChunkedDecoder::Status::kError &&
        (other->body != whole.body || other->used != whole.used)) {
      std::abort();
    }
  }
  return 0;
}
