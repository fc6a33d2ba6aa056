#pragma once
// The reference engine's tokens: deterministic, and a function of the weights it holds, so
// that a test or a trainer can predict every token (and see rollouts change after a weight
// sync). The exact formula, also in vllm-ref-engine(1):
//
//   mix(x)      = splitmix64's finalizer: x += 0x9e3779b97f4a7c15;
//                 x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9; x = (x ^ (x >> 27)) *
//                 0x94d049bb133111eb; x ^ (x >> 31)   (all arithmetic mod 2^64)
//   key         = the sampling params' seed (as uint64, two's complement) when set, else the
//                 FNV-1a 64 of the request id's bytes (offset 0xcbf29ce484222325, prime
//                 0x100000001b3)
//   digest      = d := 0; for each prompt token p: d := mix(d ^ uint64(p))
//   base        = mix(mix(mix(fingerprint) ^ key) ^ digest)
//   token(t)    = mix(base ^ t) mod vocab_size, t = 0 for the first output token
//
// While min_tokens masks the stop tokens (t < min_tokens), a token that is one is replaced
// by (token + 1) mod vocab_size until it is not. The fingerprint is computed once per
// finished weight-update session and per set_weight_version, never per token:
//
//   material    = for each tensor worker 0 holds, by name (only the tcp backend holds bytes):
//                   name + " " + sha256_hex(bytes) + "\n"
//                 then "version " + weight_version + "\n" + "sessions " + N + "\n", N = the
//                 sessions worker 0 finished (decimal)
//   fingerprint = the first 16 hex digits of sha256_hex(material), as a big-endian uint64
//
// Logprobs: the sampled (or prompt) token is the most likely one, rank 1, logprob -0.5; top
// column j (1..k) is token (token + j - 1) mod vocab_size with rank j and logprob -0.5 * j.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace vllmd::reference {

std::uint64_t mix64(std::uint64_t x);
std::uint64_t request_key(std::optional<std::int64_t> seed, std::string_view request_id);
std::uint64_t prompt_digest(std::span<const std::int64_t> prompt);
std::uint64_t token_base(std::uint64_t fingerprint, std::uint64_t key, std::uint64_t digest);
std::int64_t token_at(std::uint64_t base, std::int64_t t, std::int64_t vocab_size);

// The fingerprint of the weights `tensors` (by name), labelled `version`, after `sessions`
// finished weight-update sessions.
std::uint64_t weights_fingerprint(const std::map<std::string, std::string>& tensors,
                                  std::string_view version, std::uint64_t sessions);

// The logprob of the token of rank `rank` (1 = the most likely).
inline float logprob_of_rank(std::int64_t rank) { return -0.5f * static_cast<float>(rank); }

}  // namespace vllmd::reference
