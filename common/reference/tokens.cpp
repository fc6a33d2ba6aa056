#include "common/reference/tokens.hpp"

#include "common/reference/tcp_transfer.hpp"

namespace vllmd::reference {

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t request_key(std::optional<std::int64_t> seed, std::string_view request_id) {
  if (seed) return static_cast<std::uint64_t>(*seed);
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : request_id) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::uint64_t prompt_digest(std::span<const std::int64_t> prompt) {
  std::uint64_t digest = 0;
  for (const std::int64_t token : prompt)
    digest = mix64(digest ^ static_cast<std::uint64_t>(token));
  return digest;
}

std::uint64_t token_base(std::uint64_t fingerprint, std::uint64_t key, std::uint64_t digest) {
  return mix64(mix64(mix64(fingerprint) ^ key) ^ digest);
}

std::int64_t token_at(std::uint64_t base, std::int64_t t, std::int64_t vocab_size) {
  return static_cast<std::int64_t>(mix64(base ^ static_cast<std::uint64_t>(t)) %
                                   static_cast<std::uint64_t>(vocab_size));
}

std::uint64_t weights_fingerprint(const std::map<std::string, std::string>& tensors,
                                  std::string_view version, std::uint64_t sessions) {
  std::string material;
  for (const auto& [name, bytes] : tensors) {
    material.append(name).append(" ").append(sha256_hex(bytes)).append("\n");
  }
  material.append("version ").append(version).append("\n");
  material.append("sessions ").append(std::to_string(sessions)).append("\n");
  return std::stoull(sha256_hex(material).substr(0, 16), nullptr, 16);
}

}  // namespace vllmd::reference
