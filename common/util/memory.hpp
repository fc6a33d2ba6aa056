#pragma once
// Large buffers (request bodies, transcoded updates, engine frames: up to ~90 MB) are written
// once, front to back, into fresh memory. With 4 KiB pages that is a page fault per 4 KiB,
// which costs more than parsing the bytes (~60% of the transcoder's time on a 40 MB body).

#include <cstddef>

namespace vllmd::util {

// Asks for transparent huge pages on the block (one fault per 2 MiB). Only a hint, for blocks
// of 4 MiB and more: without THP (or with THP "always") nothing changes.
void advise_huge_pages(void* block, std::size_t size);

}  // namespace vllmd::util
