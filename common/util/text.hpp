#pragma once
// Small text helpers shared by the configuration and the HTTP parser.

#include <string_view>
#include <vector>

namespace vllmd::util {

// Without the spaces and tabs around it.
inline std::string_view trim_blanks(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// "a, b,,c" as {"a", "b", "c"}: the comma-separated items, trimmed, empty ones dropped.
inline std::vector<std::string_view> split_list(std::string_view text) {
  std::vector<std::string_view> items;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = trim_blanks(text.substr(0, comma));
    if (!item.empty()) items.push_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return items;
}

}  // namespace vllmd::util
