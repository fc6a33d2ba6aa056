// Fuzz target: a TOML configuration document, loaded as a --config file would be.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "daemon/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)vllmd::daemon::load_toml_text(text);
  return 0;
}
