#include "common/util/memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace vllmd::util {

void advise_huge_pages(void* block, std::size_t size) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::size_t kWorthIt = std::size_t{4} << 20;
  if (block == nullptr || size < kWorthIt) return;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<std::uintptr_t>(block);
  const auto first = (start + page - 1) & ~(page - 1);
  const auto last = (start + size) & ~(page - 1);
  // The aligned address as an offset into the block: pointer arithmetic, no integer-to-pointer.
  if (last > first)
    madvise(static_cast<char*>(block) + (first - start), last - first, MADV_HUGEPAGE);
#else
  (void)block;
  (void)size;
#endif
}

}  // namespace vllmd::util
