// daemon/http/parser: request heads and chunked bodies, RFC 9112's framing rules.
#include <doctest/doctest.h>

#include <string>

#include "daemon/http/parser.hpp"

using vllmd::daemon::http::BodyFraming;
using vllmd::daemon::http::ChunkedDecoder;
using vllmd::daemon::http::find_head_end;
using vllmd::daemon::http::parse_head;

namespace {

int refused_with(const std::string& head) {
  const auto parsed = parse_head(head);
  return parsed ? 0 : parsed.error().status;
}

struct Decoded {
  ChunkedDecoder::Status status;
  std::string body;
  std::size_t consumed = 0;
  int error = 0;
};

Decoded decode(const std::string& bytes, std::uint64_t limit = 1 << 20) {
  ChunkedDecoder decoder(limit, 1024);
  Decoded result;
  result.status = decoder.feed(bytes, result.consumed, result.body);
  if (result.status == ChunkedDecoder::Status::kError) result.error = decoder.error().status;
  return result;
}

}  // namespace

TEST_CASE("the end of a head is its blank line, bare LF included so it can be refused") {
  CHECK(find_head_end("GET / HTTP/1.1\r\nHost: x\r\n\r\nbody") == 27);
  CHECK(find_head_end("GET / HTTP/1.1\r\nHost: x\r\n") == std::string::npos);
  CHECK(find_head_end("GET / HTTP/1.1\nHost: x\n\n") == 24);
  CHECK(find_head_end("\r\n\r\nGET / HTTP/1.1\r\n\r\n") == 22);  // leading empty lines skipped
  // Resuming a search: the bytes before `from` are not looked at again.
  const std::string partial = "GET / HTTP/1.1\r\nHost: x\r\n";
  CHECK(find_head_end(partial + "\r\n", partial.size() - 3) == partial.size() + 2);
}

TEST_CASE("a well-formed head: method, target, version, fields and framing") {
  const std::string text =
      "POST /update_weights?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\n"
      "Authorization:  Bearer k \r\nX-Empty:\r\n\r\n";
  const auto head = parse_head(text);
  REQUIRE(head);
  CHECK(head->method == "POST");
  CHECK(head->target == "/update_weights?x=1");
  CHECK(head->minor_version == 1);
  CHECK(head->framing == BodyFraming::kLength);
  CHECK(head->content_length == 12);
  CHECK(head->field("AUTHORIZATION") == "Bearer k");
  CHECK(head->field("x-empty").empty());
  CHECK(head->keep_alive);
  CHECK_FALSE(head->expect_continue);
}

TEST_CASE("keep-alive follows the version and Connection") {
  CHECK_FALSE(parse_head("GET / HTTP/1.0\r\n\r\n")->keep_alive);
  CHECK(parse_head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")->keep_alive);
  CHECK_FALSE(
      parse_head("GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\n\r\n")->keep_alive);
  CHECK(parse_head("GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n\r\n")->keep_alive);
}

TEST_CASE("Content-Length: zero means no body; invalid or repeated values are refused") {
  CHECK(parse_head("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")->framing ==
        BodyFraming::kNone);
  for (const char* value : {"-1", "", "abc", "1 2", "5, 5", "+5", "0x10", "1000000000000000000"}) {
    CAPTURE(value);
    CHECK(refused_with(std::string("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: ") + value +
                       "\r\n\r\n") == 400);
  }
  CHECK(refused_with(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n") == 400);
}

TEST_CASE("Transfer-Encoding: only chunked, last, alone") {
  const auto chunked =
      parse_head("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n");
  REQUIRE(chunked);
  CHECK(chunked->framing == BodyFraming::kChunked);
  CHECK(refused_with("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n") == 400);
  CHECK(refused_with("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     "Content-Length: 3\r\n\r\n") == 400);
  CHECK(refused_with("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n") ==
        400);
  CHECK(refused_with("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n") ==
        501);
  CHECK(refused_with("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n") == 400);
  CHECK(refused_with("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n") == 400);
}

TEST_CASE("versions, targets and Host") {
  CHECK(refused_with("GET / HTTP/2.0\r\nHost: x\r\n\r\n") == 505);
  CHECK(refused_with("GET / HTTP/1.2\r\nHost: x\r\n\r\n") == 505);
  CHECK(refused_with("GET / HTTP/1\r\nHost: x\r\n\r\n") == 400);
  CHECK(refused_with("GET / http/1.1\r\nHost: x\r\n\r\n") == 400);
  CHECK(refused_with("GET  / HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
  CHECK(refused_with("GET * HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
  CHECK(refused_with("GET /caf\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
  CHECK(refused_with("GET / HTTP/1.1\r\n\r\n") == 400);
  CHECK(refused_with("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") == 400);
  CHECK(refused_with("GET / HTTP/1.0\r\n\r\n") == 0);
  CHECK(parse_head("GET http://h:1/weight_info HTTP/1.1\r\nHost: h\r\n\r\n")->target ==
        "http://h:1/weight_info");
}

TEST_CASE("field lines that parsers could split differently are refused") {
  using namespace std::string_literals;
  CHECK(refused_with("GET / HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n\r\n") == 400);  // obs-fold
  CHECK(refused_with("GET / HTTP/1.1\r\nHost : x\r\n\r\n") == 400);
  CHECK(refused_with("GET / HTTP/1.1\r\nHost: x\r\nX-A: b\rc\r\n\r\n") == 400);
  CHECK(refused_with("GET / HTTP/1.1\r\nHost: x\r\nX\0A: b\r\n\r\n"s) == 400);
  CHECK(refused_with("GET / HTTP/1.1\r\nHost: x\r\nX-A: b\0c\r\n\r\n"s) == 400);
  CHECK(refused_with("GET / HTTP/1.1\nHost: x\n\n") == 400);
  CHECK(refused_with("GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n") == 400);
  CHECK(refused_with("GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n") == 400);
  CHECK(refused_with("GET / HTTP/1.1\r\nHost: x\r\nX-A: caf\xc3\xa9\r\n\r\n") == 0);  // obs-text
}

TEST_CASE("Expect: 100-continue only") {
  const auto head = parse_head(
      "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\n"
      "Content-Length: 1\r\n\r\n");
  REQUIRE(head);
  CHECK(head->expect_continue);
  CHECK_FALSE(parse_head("POST / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n")->expect_continue);
  CHECK(refused_with("POST / HTTP/1.1\r\nHost: x\r\nExpect: something\r\n\r\n") == 417);
}

TEST_CASE("more than 100 fields is 431") {
  std::string head = "GET / HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 100; ++i) head += "X-" + std::to_string(i) + ": y\r\n";
  CHECK(refused_with(head + "\r\n") == 431);
}

TEST_CASE("chunked bodies: data, extensions, trailers, and what follows") {
  const Decoded done = decode("5;name=value\r\nhello\r\n6 \r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT");
  CHECK(done.status == ChunkedDecoder::Status::kDone);
  CHECK(done.body == "hello world");
  CHECK(done.consumed ==
        std::string("5;name=value\r\nhello\r\n6 \r\n world\r\n0\r\nX-T: 1\r\n\r\n").size());
  const Decoded partial = decode("5\r\nhel");
  CHECK(partial.status == ChunkedDecoder::Status::kNeedMore);
  CHECK(partial.body == "hel");
}

TEST_CASE("chunked bodies the decoder refuses") {
  for (const char* bad :
       {"zz\r\n", "-5\r\nhello\r\n", "0x5\r\nhello\r\n", "ffffffffffffffffff\r\n", "\r\n",
        "5\nhello\r\n", "3\r\nabcdef\r\n0\r\n\r\n", "3\r\nabc\n0\r\n\r\n",
        "0\r\nbad trailer\r\n\r\n", "0\r\n folded: x\r\n\r\n", "1;\x01\r\na\r\n"}) {
    CAPTURE(bad);
    const Decoded decoded = decode(bad);
    CHECK(decoded.status == ChunkedDecoder::Status::kError);
    CHECK(decoded.error == 400);
  }
  CHECK(decode("11\r\n" + std::string(17, 'a') + "\r\n0\r\n\r\n", 16).error == 413);
  CHECK(decode("0\r\nX: " + std::string(2000, 'a') + "\r\n\r\n").error == 431);
}

TEST_CASE("a chunked body decodes the same in any pieces") {
  const std::string body = "4\r\nwiki\r\n5;x=y\r\npedia\r\n0\r\nT: v\r\n\r\nrest";
  ChunkedDecoder decoder(1 << 20, 1024);
  std::string out;
  std::size_t used = 0;
  ChunkedDecoder::Status status = ChunkedDecoder::Status::kNeedMore;
  while (status == ChunkedDecoder::Status::kNeedMore && used < body.size()) {
    std::size_t consumed = 0;
    status = decoder.feed(std::string_view(body).substr(used, 1), consumed, out);
    used += consumed;
  }
  CHECK(status == ChunkedDecoder::Status::kDone);
  CHECK(out == "wikipedia");
  CHECK(body.substr(used) == "rest");
}
