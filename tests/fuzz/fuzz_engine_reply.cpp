// Fuzz target: bytes from an engine (or a peer on the handshake socket). Every decoder must
// answer with a value or an error string: never crash, never throw.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/wire/messages.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace wire = vllmd::wire;
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  (void)wire::decode_engine_core_outputs(frame);
  (void)wire::decode_handshake_status(frame);
  (void)wire::decode_registration(frame);
  (void)wire::decode_utility_request(frame);
  (void)wire::decode_init(frame);
  return 0;
}
