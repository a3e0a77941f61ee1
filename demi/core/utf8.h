// UTF-8 (RFC 3629), for the modules that read text: the JSON of safetensors headers (demi/io) and text
// data sets (demi/data). Header-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace demi {

// The code point that starts at s[pos] and its length in bytes; length 0 when the bytes there are not
// UTF-8: a stray continuation byte, a sequence cut short by the end of s, an overlong form, a surrogate
// or a code point above U+10FFFF.
inline std::pair<char32_t, int> decode_utf8(std::string_view s, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[pos + i]); };
  const uint8_t c = b(0);
  if (c < 0x80) return {c, 1};
  const int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (len == 0 || s.size() - pos < static_cast<size_t>(len)) return {0, 0};
  char32_t cp = c & (0x7F >> len);
  for (int i = 1; i < len; ++i) {
    if ((b(static_cast<size_t>(i)) & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (b(static_cast<size_t>(i)) & 0x3F);
  }
  static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, len};
}

// Appends code point `cp` (at most U+10FFFF, not a surrogate) as UTF-8.
inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace demi
