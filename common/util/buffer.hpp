#pragma once
// A growable byte buffer on malloc/realloc. Large buffers (tens of MB of transcoded weights
// metadata) grow through realloc, which glibc turns into mremap for big blocks instead of a
// copy, and the block can be handed to ZeroMQ without copying it (release()).

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <utility>

namespace vllmd::util {

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t capacity) { reserve(capacity); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Buffer moved(std::move(other));
    swap(moved);
    return *this;
  }
  ~Buffer() { std::free(data_); }

  char* data() { return data_; }
  const char* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::string_view view() const { return {data_, size_}; }
  std::string str() const { return std::string(view()); }

  void reserve(std::size_t capacity) {
    if (capacity <= capacity_) return;
    void* grown = std::realloc(data_, capacity);
    if (grown == nullptr) throw std::bad_alloc();
    data_ = static_cast<char*>(grown);
    capacity_ = capacity;
  }
  // Makes room for `extra` more bytes, growing by at least half so appends stay amortized O(1).
  char* grow(std::size_t extra) {
    if (size_ + extra > capacity_) reserve(std::max(size_ + extra, capacity_ + capacity_ / 2 + 64));
    return data_ + size_;
  }
  void append(const char* bytes, std::size_t count) {
    std::memcpy(grow(count), bytes, count);
    size_ += count;
  }
  void append(std::string_view bytes) { append(bytes.data(), bytes.size()); }
  void push_back(char byte) {
    *grow(1) = byte;
    ++size_;
  }
  void resize(std::size_t size) {
    reserve(size);
    size_ = size;
  }
  void clear() { size_ = 0; }

  // Hands the malloc'd block to the caller, who must free() it.
  char* release() {
    char* block = data_;
    data_ = nullptr;
    size_ = capacity_ = 0;
    return block;
  }

  void swap(Buffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(capacity_, other.capacity_);
  }

 private:
  char* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace vllmd::util
