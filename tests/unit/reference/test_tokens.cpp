// The token formula of tokens.hpp, pinned to values computed by hand from its comment (the
// Python a trainer would write gives the same), and the weights fingerprint.

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/reference/tcp_transfer.hpp"
#include "common/reference/tokens.hpp"

using namespace vllmd::reference;

TEST_SUITE("reference_tokens") {
  TEST_CASE("splitmix64's finalizer and FNV-1a, as documented") {
    // splitmix64 seeded with 0 yields 0xe220a8397b1dcdaf first: mix64(0) is that output.
    CHECK(mix64(0) == 0xe220a8397b1dcdafULL);
    // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c; of "" the offset basis.
    CHECK(request_key(std::nullopt, "a") == 0xaf63dc4c8601ec8cULL);
    CHECK(request_key(std::nullopt, "") == 0xcbf29ce484222325ULL);
    CHECK(request_key(-1, "ignored") == UINT64_MAX);
    CHECK(request_key(42, "x") == 42);
  }

  TEST_CASE("the token chain") {
    const std::vector<std::int64_t> prompt = {1, 2, 3};
    const std::uint64_t digest = mix64(mix64(mix64(0 ^ 1) ^ 2) ^ 3);
    CHECK(prompt_digest(prompt) == digest);
    CHECK(prompt_digest({}) == 0);
    const std::uint64_t base = token_base(7, 42, digest);
    CHECK(base == mix64(mix64(mix64(7) ^ 42) ^ digest));
    CHECK(token_at(base, 5, 1000) == static_cast<std::int64_t>(mix64(base ^ 5) % 1000));
    // Another fingerprint, another token stream.
    int differ = 0;
    for (int t = 0; t < 16; ++t) {
      differ += token_at(base, t, 32000) != token_at(token_base(8, 42, digest), t, 32000);
    }
    CHECK(differ >= 14);
  }

  TEST_CASE("the fingerprint covers the tensors, the version and the session count") {
    const std::map<std::string, std::string> none;
    const std::string material = "version v1\nsessions 1\n";
    CHECK(weights_fingerprint(none, "v1", 1) ==
          std::stoull(sha256_hex(material).substr(0, 16), nullptr, 16));
    const std::map<std::string, std::string> tensors = {{"b", "xy"}, {"a", "z"}};
    const std::string with_tensors =
        "a " + sha256_hex("z") + "\nb " + sha256_hex("xy") + "\nversion v1\nsessions 1\n";
    CHECK(weights_fingerprint(tensors, "v1", 1) ==
          std::stoull(sha256_hex(with_tensors).substr(0, 16), nullptr, 16));
    CHECK(weights_fingerprint(none, "v1", 2) != weights_fingerprint(none, "v1", 1));
    CHECK(weights_fingerprint(none, "v2", 1) != weights_fingerprint(none, "v1", 1));
    const std::map<std::string, std::string> changed = {{"b", "xY"}, {"a", "z"}};
    CHECK(weights_fingerprint(changed, "v1", 1) != weights_fingerprint(tensors, "v1", 1));
  }
}
