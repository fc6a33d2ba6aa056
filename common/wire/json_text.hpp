#pragma once
// JSON text written by hand: string literals for the bodies, errors and logs we compose
// ourselves (everything else goes through a JSON library or the msgpack transcoders).

#include <string>
#include <string_view>

namespace vllmd::wire {

// Appends `text` as a JSON string literal (quotes included); control bytes become \uXXXX.
void append_json_string(std::string& out, std::string_view text);
std::string json_string(std::string_view text);

}  // namespace vllmd::wire
