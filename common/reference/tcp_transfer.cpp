#include "common/reference/tcp_transfer.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <thread>

#include "common/util/errno_text.hpp"

namespace vllmd::reference {

namespace {

using Clock = std::chrono::steady_clock;

std::string strip_torch_prefix(std::string_view dtype) {
  constexpr std::string_view kPrefix = "torch.";
  if (dtype.substr(0, kPrefix.size()) == kPrefix) dtype.remove_prefix(kPrefix.size());
  return std::string(dtype);
}

void put_be32(char* out, std::uint32_t value) {
  for (int i = 3; i >= 0; --i, value >>= 8) out[i] = static_cast<char>(value & 0xff);
}

std::uint64_t get_be64(const char* in) {
  std::uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | static_cast<unsigned char>(in[i]);
  return value;
}

// One connection attempt to any address of host:port; -1 and the reason otherwise.
int try_connect(const std::string& host, int port, std::string& reason) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int error = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); error != 0) {
    reason = gai_strerror(error);
    return -1;
  }
  int fd = -1;
  for (addrinfo* address = found; address != nullptr && fd < 0; address = address->ai_next) {
    fd = socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC, address->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, address->ai_addr, address->ai_addrlen) != 0) {
      reason = util::errno_text(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

}  // namespace

std::size_t dtype_size(std::string_view name) {
  static constexpr std::array<std::pair<std::string_view, std::size_t>, 14> kSizes = {{
      {"float32", 4},
      {"float", 4},
      {"float16", 2},
      {"half", 2},
      {"bfloat16", 2},
      {"float64", 8},
      {"double", 8},
      {"int64", 8},
      {"int32", 4},
      {"int16", 2},
      {"int8", 1},
      {"uint8", 1},
      {"bool", 1},
      {"float8_e4m3fn", 1},
  }};
  const std::string dtype = strip_torch_prefix(name);
  for (const auto& [known, size] : kSizes) {
    if (known == dtype) return size;
  }
  return 0;
}

tl::expected<std::shared_ptr<TcpReceiver>, std::string> TcpReceiver::connect(
    const std::string& host, int port, int rank, int world_size, std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  std::string reason;
  int fd = -1;
  while ((fd = try_connect(host, port, reason)) < 0) {
    if (Clock::now() >= deadline) {
      return tl::unexpected("the trainer at " + host + ":" + std::to_string(port) +
                            " did not accept within " + std::to_string(wait.count() / 1000) +
                            " s (" + reason + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  std::array<char, 16> hello{'V', 'L', 'L', 'M', 'D', 'R', 'E', 'F'};
  put_be32(&hello[8], static_cast<std::uint32_t>(rank));
  put_be32(&hello[12], static_cast<std::uint32_t>(world_size));
  auto receiver = std::shared_ptr<TcpReceiver>(new TcpReceiver(fd));
  if (send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) {
    return tl::unexpected("cannot introduce worker rank " + std::to_string(rank) +
                          " to the trainer: " + util::errno_text(errno));
  }
  return receiver;
}

TcpReceiver::~TcpReceiver() {
  if (fd_ >= 0) close(fd_);
}

tl::expected<void, std::string> TcpReceiver::read_exactly(char* data, std::size_t size,
                                                          std::chrono::milliseconds wait) {
  if (fd_ < 0) {
    return tl::unexpected(
        std::string("the connection to the trainer was dropped after a bad tensor: init again"));
  }
  const auto deadline = Clock::now() + wait;
  std::size_t done = 0;
  while (done < size) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return tl::unexpected(std::string("timed out waiting for the trainer's bytes"));
    pollfd ready{fd_, POLLIN, 0};
    if (poll(&ready, 1, static_cast<int>(std::min<long long>(left, 1000))) <= 0) continue;
    const ssize_t got = recv(fd_, data + done, size - done, 0);
    if (got == 0) return tl::unexpected(std::string("the trainer closed the connection"));
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return tl::unexpected("reading from the trainer: " + util::errno_text(errno));
    }
    done += static_cast<std::size_t>(got);
  }
  return {};
}

tl::expected<std::string, std::string> TcpReceiver::receive(std::size_t size,
                                                            std::chrono::milliseconds wait) {
  std::array<char, 8> header{};
  if (auto read = read_exactly(header.data(), header.size(), wait); !read) {
    return tl::unexpected(read.error());
  }
  const std::uint64_t length = get_be64(header.data());
  if (length != size) {
    close(fd_);
    fd_ = -1;
    return tl::unexpected("the trainer sent " + std::to_string(length) +
                          " bytes where update_info's dtype and shape say " + std::to_string(size));
  }
  std::string bytes(size, '\0');
  if (auto read = read_exactly(bytes.data(), size, wait); !read)
    return tl::unexpected(read.error());
  return bytes;
}

std::string sha256_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest.data(), &length, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(std::size_t{2} * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

}  // namespace vllmd::reference
