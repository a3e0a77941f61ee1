// A small, strict JSON reader and writer for safetensors headers. It accepts only what those headers
// hold — objects, arrays, strings and integers — and refuses everything else (floats, true/false/null,
// duplicate keys, trailing commas, invalid UTF-8, unpaired surrogates, nesting deeper than kMaxDepth),
// because a header that needs more is not one demi wrote or one PyTorch/Hugging Face would write, and
// a permissive parser is a larger attack surface for hostile files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace demi::io::internal {

struct JsonValue {
  enum class Kind { kObject, kArray, kString, kInteger };
  Kind kind = Kind::kObject;
  std::string string;                                     // kString
  int64_t integer = 0;                                    // kInteger
  std::vector<JsonValue> items;                           // kArray
  // kObject: keys[i] names values[i], in document order; keys are unique. (Two vectors rather than a
  // vector of pairs: std::pair may not hold the still-incomplete JsonValue, std::vector may.)
  std::vector<std::string> keys;
  std::vector<JsonValue> values;

  // The member named `key`, or nullptr.
  const JsonValue* find(std::string_view key) const;
};

const char* json_kind_name(JsonValue::Kind k);  // "object", "array", "string", "integer"

// Nesting limit: a safetensors header is three levels deep; the limit keeps a hostile "[[[[..." from
// exhausting the stack.
inline constexpr int kMaxJsonDepth = 16;

// Parses `text` (whitespace may surround the value). A syntax error is a demi::Error that starts with
// `where` and gives the byte offset and what was expected there.
JsonValue parse_json(std::string_view text, std::string_view where);

// `s` as a JSON string literal, quotes included; control characters are escaped as \u00XX.
std::string json_quote(std::string_view s);
// `v` as a JSON number with up to 9 significant digits; null when it is not finite (JSON has no NaN).
std::string json_number(double v);
// A flat JSON object of values already written (json_quote'd strings, json_number's, nested objects), in
// the keys' order: one line of the command line's --json output.
std::string json_object(const std::map<std::string, std::string>& fields);

}  // namespace demi::io::internal
