// Shared helpers of the libFuzzer harnesses (tests/fuzz, docs/RELIABILITY.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace bs::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Splits the input at the first "\n---\n" (a field separator of the seed files): the part before
// and the part after (empty when there is none).
inline std::pair<std::string_view, std::string_view> split_input(std::string_view in) {
  constexpr std::string_view kSep = "\n---\n";
  const size_t at = in.find(kSep);
  if (at == std::string_view::npos) return {in, {}};
  return {in.substr(0, at), in.substr(at + kSep.size())};
}

}  // namespace bs::fuzz
