// Hand-written JSON text (common/wire/json_text.*): string literals with every escape,
// read back by the JSON parser to the same bytes.

#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "common/wire/json_text.hpp"
#include "common/wire/json_to_msgpack.hpp"

namespace vllmd::wire {
namespace {

TEST_CASE("json_string escapes quotes, backslashes and control bytes") {
  CHECK(json_string("") == R"("")");
  CHECK(json_string("plain") == R"("plain")");
  CHECK(json_string("a\"b\\c") == R"("a\"b\\c")");
  CHECK(json_string(std::string_view("x\0y", 3)) == R"("x\u0000y")");
  CHECK(json_string("tab\there") == R"("tab\there")");
  // Escapes first, last and back to back, between runs copied whole; UTF-8 passes as is.
  CHECK(json_string("\"\xc3\xa9\\\\x\n") == "\"\\\"\xc3\xa9\\\\\\\\x\\n\"");
  std::string out = "prefix:";
  append_json_string(out, "v\n");
  CHECK(out == R"(prefix:"v\n")");
}

TEST_CASE("every control byte comes out escaped and reads back as itself") {
  for (int byte = 0; byte < 0x20; ++byte) {
    CAPTURE(byte);
    const std::string text(1, static_cast<char>(byte));
    const std::string json = json_string(text);
    CHECK(json.size() > 3);
    CHECK(json.find(static_cast<char>(byte)) == std::string::npos);
    auto back = json_to_msgpack(json);
    REQUIRE(back.has_value());
    CHECK(back->msgpack.str() == std::string(1, '\xa1') + text);
  }
}

}  // namespace
}  // namespace vllmd::wire
