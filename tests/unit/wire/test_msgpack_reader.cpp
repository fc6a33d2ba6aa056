// The forward msgpack reader (common/wire/msgpack_reader.*): every width of every type it
// reads, reads of the wrong type that leave the value for the next, and frames cut short,
// oversized or malformed, which fail for good and agree with the tree decoder (decode).

#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "common/wire/msgpack_codec.hpp"
#include "common/wire/msgpack_reader.hpp"
#include "tests/unit/wire/hex.hpp"

using namespace vllmd::wire;
using vllmd::test::from_hex;

TEST_CASE("integers of every width read as int64, and a uint64 past its range is left") {
  const std::string bytes = from_hex(
      "05"                    // positive fixint
      "e0"                    // negative fixint -32
      "ccff"                  // uint8 255
      "cd04d2"                // uint16 1234
      "ce00010000"            // uint32 65536
      "cf7fffffffffffffff"    // uint64 INT64_MAX
      "d080"                  // int8 -128
      "d1fc18"                // int16 -1000
      "d2fffe7960"            // int32 -100000
      "d38000000000000000"    // int64 INT64_MIN
      "cf8000000000000000");  // uint64 2^63: an integer, not an int64
  MsgpackReader reader(bytes);
  CHECK(reader.int64() == 5);
  CHECK(reader.int64() == -32);
  CHECK(reader.int64() == 255);
  CHECK(reader.int64() == 1234);
  CHECK(reader.int64() == 65536);
  CHECK(reader.int64() == INT64_MAX);
  CHECK(reader.int64() == -128);
  CHECK(reader.int64() == -1000);
  CHECK(reader.int64() == -100000);
  CHECK(reader.int64() == INT64_MIN);
  CHECK_FALSE(reader.int64().has_value());
  CHECK_FALSE(reader.failed());
  CHECK(reader.skip());
  CHECK(reader.done());
  // read_checked_int reads what int64 accepted, in place.
  const std::string wide = from_hex("d1fc18");
  const char* at = wide.data();
  CHECK(read_checked_int(at) == -1000);
  CHECK(at == wide.data() + wide.size());
}

TEST_CASE("a read of the wrong type leaves the value for the next read") {
  const std::string bytes = from_hex(
      "a3616263"
      "c0"
      "92"
      "01"
      "02"
      "81"
      "a178"
      "c3");
  MsgpackReader reader(bytes);
  CHECK_FALSE(reader.int64().has_value());
  CHECK_FALSE(reader.array().has_value());
  CHECK_FALSE(reader.nil());
  CHECK(reader.str() == "abc");
  CHECK_FALSE(reader.str().has_value());
  CHECK(reader.nil());
  CHECK_FALSE(reader.map().has_value());
  CHECK(reader.array() == 2U);
  CHECK(reader.int64() == 1);
  CHECK(reader.int64() == 2);
  CHECK(reader.map() == 1U);
  CHECK(reader.str() == "x");
  CHECK(reader.skip());  // a boolean
  CHECK(reader.done());
  CHECK_FALSE(reader.failed());
}

TEST_CASE("long strings, arrays, maps and every ext width") {
  const std::string text(40, 'a');
  const std::string bytes = from_hex("d928") + text +
                            from_hex(
                                "dc0001"
                                "01"
                                "dd00000001"
                                "02"
                                "de0001"
                                "a16b"
                                "03"
                                "d40301"
                                "d5030102"
                                "c70203aabb"
                                "c8000203aabb"
                                "c90000000203aabb");
  MsgpackReader reader(bytes);
  CHECK(reader.str() == text);
  CHECK(reader.array() == 1U);
  CHECK(reader.int64() == 1);
  CHECK(reader.array() == 1U);
  CHECK(reader.int64() == 2);
  CHECK(reader.map() == 1U);
  CHECK(reader.str() == "k");
  CHECK(reader.int64() == 3);
  for (std::size_t size : {1U, 2U, 2U, 2U, 2U}) {
    const auto ext = reader.ext();
    REQUIRE(ext.has_value());
    CHECK(ext->type == 3);
    CHECK(ext->data.size() == size);
  }
  CHECK(reader.done());
}

TEST_CASE("skip and raw pass over nested values of every kind, bin and floats too") {
  const std::string frame = from_hex(
                                "82"
                                "a161"
                                "93c0c2c3"
                                "a162"
                                "93c4020102"
                                "ca3f800000"
                                "cb3ff0000000000000") +
                            from_hex("05");
  MsgpackReader reader(frame);
  const auto raw = reader.raw();
  REQUIRE(raw.has_value());
  CHECK(raw->size() == frame.size() - 1);
  CHECK(reader.int64() == 5);
  CHECK(reader.done());
  // raw_map takes only a map.
  const std::string two = from_hex(
      "91c0"
      "80");
  MsgpackReader maps(two);
  CHECK_FALSE(maps.raw_map().has_value());
  CHECK(maps.skip());
  CHECK(maps.raw_map() == from_hex("80"));
  CHECK(maps.done());
}

TEST_CASE("frames cut short, oversized or malformed fail for good, as decode refuses them") {
  auto refused = [](std::string_view hex, const DecodeLimits& limits = {}) {
    const std::string bytes = from_hex(hex);
    MsgpackReader reader(bytes, limits);
    const bool skipped = reader.skip();
    CHECK_FALSE(decode(bytes, limits).has_value());
    CHECK_FALSE(skipped);
    CHECK(reader.failed());
    CHECK_FALSE(reader.done());
    // Nothing more reads once failed.
    CHECK_FALSE(reader.int64().has_value());
    return reader.error();
  };
  CHECK(refused("").find("truncated") != std::string::npos);
  CHECK(refused("cd04").find("truncated") != std::string::npos);
  CHECK(refused("a4616263") == "truncated msgpack frame");
  CHECK(refused("92"
                "01")
            .find("truncated") != std::string::npos);
  CHECK(refused("c1").find("0xc1") != std::string::npos);
  CHECK(refused("c70503aa").find("truncated") != std::string::npos);
  // A count no frame of this size could hold, and one past a limit.
  CHECK(refused("dd00010000").find("truncated") != std::string::npos);
  DecodeLimits few;
  few.array = 1;
  CHECK(refused("920101", few).find("limits") != std::string::npos);
  DecodeLimits small;
  small.str = 2;
  CHECK(refused("a3616263", small).find("limits") != std::string::npos);
  small = {};
  small.depth = 2;
  CHECK(refused("919191c0", small).find("depth") != std::string::npos);
  // A typed read at the end fails too: a count announced more than the frame holds.
  const std::string empty;
  MsgpackReader reader(empty);
  CHECK_FALSE(reader.nil());
  CHECK(reader.failed());
}
