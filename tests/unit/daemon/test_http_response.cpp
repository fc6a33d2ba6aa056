// daemon/http/response: a chunk's framing, which the chunked decoder must read back.
#include <doctest/doctest.h>

#include <string>

#include "daemon/http/parser.hpp"
#include "daemon/http/response.hpp"

using vllmd::daemon::http::chunk;
using vllmd::daemon::http::ChunkedDecoder;

TEST_CASE("a chunk is its size in hex, CRLF, the data, CRLF") {
  CHECK(chunk("a") == "1\r\na\r\n");
  CHECK(chunk(std::string(15, 'x')) == "f\r\n" + std::string(15, 'x') + "\r\n");
  CHECK(chunk(std::string(16, 'x')) == "10\r\n" + std::string(16, 'x') + "\r\n");
  CHECK(chunk(std::string(0x1a2b, 'y')).substr(0, 6) == "1a2b\r\n");
  CHECK(chunk("").empty());  // an empty chunk would end the body
}

TEST_CASE("chunks framed in place decode back to the data") {
  ChunkedDecoder decoder(1 << 20, 1024);
  std::string wire;
  std::string expected;
  for (std::size_t size : {1U, 9U, 255U, 256U, 4097U}) {
    std::string data(size, static_cast<char>('a' + size % 26));
    expected += data;
    data.reserve(data.size() + 32);  // room left, as a producer leaves it
    wire += chunk(std::move(data));
  }
  wire += "0\r\n\r\n";
  std::size_t consumed = 0;
  std::string body;
  CHECK(decoder.feed(wire, consumed, body) == ChunkedDecoder::Status::kDone);
  CHECK(consumed == wire.size());
  CHECK(body == expected);
}
