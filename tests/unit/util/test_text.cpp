#include <doctest/doctest.h>

#include <string_view>
#include <vector>

#include "common/util/text.hpp"

using vllmd::util::split_list;
using vllmd::util::trim_blanks;
using Items = std::vector<std::string_view>;

TEST_CASE("trim_blanks drops spaces and tabs at both ends only") {
  CHECK(trim_blanks("") == "");
  CHECK(trim_blanks(" \t ") == "");
  CHECK(trim_blanks("\t a b \t") == "a b");
  CHECK(trim_blanks("\na\r") == "\na\r");
}

TEST_CASE("split_list: comma-separated items, trimmed, empty ones dropped") {
  CHECK(split_list("") == Items{});
  CHECK(split_list(" , ,") == Items{});
  CHECK(split_list("a") == Items{"a"});
  CHECK(split_list("a, b,,\tc ,") == Items{"a", "b", "c"});
  CHECK(split_list(",x") == Items{"x"});
}
