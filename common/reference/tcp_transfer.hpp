#pragma once
// The reference engine's real-bytes transfer backend ("tcp"): NCCL-shaped (the same init_info
// and update_info as vLLM's NCCL engine) with the bytes over TCP, so that a trainer without a
// GPU can send real tensors and check what every worker holds.
//
// As in NCCL's weight transfer, the trainer is rank 0 at master_address:master_port and each
// worker is rank rank_offset + (dp_rank * world_size + worker rank). At init every worker
// connects to the trainer (retrying until the trainer listens, as NCCL's rendezvous waits)
// and says who it is: "VLLMDREF", its rank and the world size as 32-bit big-endian integers.
// At each update the trainer sends every tensor of update_info, in order, to every worker:
// its byte length as a 64-bit big-endian integer, then the bytes (C order, as
// tensor.contiguous() holds them). init and update block until that has happened.
// examples/tcp_trainer.py is the trainer's side.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <tl/expected.hpp>

namespace vllmd::reference {

// Bytes per element of a dtype as trainers name it (torch's names: "bfloat16",
// "torch.float32", ...), or 0 for one the backend does not know.
std::size_t dtype_size(std::string_view dtype);

// One worker's connection to the trainer.
class TcpReceiver {
 public:
  // Connects to host:port, retrying for up to `wait`, and introduces itself.
  static tl::expected<std::shared_ptr<TcpReceiver>, std::string> connect(
      const std::string& host, int port, int rank, int world_size, std::chrono::milliseconds wait);
  ~TcpReceiver();
  TcpReceiver(const TcpReceiver&) = delete;
  TcpReceiver& operator=(const TcpReceiver&) = delete;

  // One tensor of `size` bytes as the trainer sent it; waits up to `wait` for each read. A
  // length other than `size` is an error, and the connection is then unusable.
  tl::expected<std::string, std::string> receive(std::size_t size, std::chrono::milliseconds wait);

 private:
  explicit TcpReceiver(int fd) : fd_(fd) {}
  tl::expected<void, std::string> read_exactly(char* data, std::size_t size,
                                               std::chrono::milliseconds wait);
  int fd_;
};

// SHA-256 of `bytes` as 64 lowercase hex digits (what hashlib.sha256(...).hexdigest() gives).
std::string sha256_hex(std::string_view bytes);

}  // namespace vllmd::reference
