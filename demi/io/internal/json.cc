// The strict JSON reader and writer of json.h: a recursive-descent parser over a string_view that never
// reads past its end, with integer overflow and nesting depth checked.
#include "demi/io/internal/json.h"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <unordered_set>

#include "demi/core/error.h"
#include "demi/core/utf8.h"

namespace demi::io::internal {
namespace {

class Parser {
 public:
  Parser(std::string_view text, std::string_view where) : s_(text), where_(where) {}

  JsonValue parse_document() {
    skip_ws();
    JsonValue v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected content after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    std::string near;
    for (size_t i = pos_; i < s_.size() && i < pos_ + 16; ++i) {
      unsigned char c = static_cast<unsigned char>(s_[i]);
      near += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
    }
    throw Error(str_cat(where_, ": invalid JSON at byte ", pos_, ": ", what,
                        pos_ < s_.size() ? str_cat(" (found \"", near, "\")") : std::string(" (at the end)")));
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  void expect(char c, std::string_view context) {
    if (peek() != c) fail(str_cat("expected '", c, "' ", context));
    ++pos_;
  }

  JsonValue parse_value(int depth) {
    if (depth >= kMaxJsonDepth) fail(str_cat("nesting deeper than ", kMaxJsonDepth, " levels"));
    char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') {
      JsonValue v;
      v.kind = JsonValue::Kind::kString;
      v.string = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_integer();
    fail("expected an object, array, string or integer (a safetensors header holds nothing else)");
  }

  JsonValue parse_object(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    // The keys seen so far, hashed: a linear find per key made the check quadratic (a header of 1.5M
    // tensors never finished parsing; 100k took 8.6 s).
    std::unordered_set<std::string> seen;
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      size_t key_at = pos_;
      std::string key = parse_string();
      if (!seen.insert(key).second) {
        pos_ = key_at;
        fail(str_cat("duplicate key ", json_quote(key)));
      }
      skip_ws();
      expect(':', str_cat("after the key ", json_quote(key)));
      skip_ws();
      JsonValue member = parse_value(depth + 1);
      v.keys.push_back(std::move(key));
      v.values.push_back(std::move(member));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}', "or ',' in an object");
      return v;
    }
  }

  JsonValue parse_array(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::kArray;
    ++pos_;  // '['
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_ws();
      v.items.push_back(parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']', "or ',' in an array");
      return v;
    }
  }

  JsonValue parse_integer() {
    JsonValue v;
    v.kind = JsonValue::Kind::kInteger;
    bool negative = peek() == '-';
    if (negative) ++pos_;
    if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit");
    if (peek() == '0' && pos_ + 1 < s_.size() && s_[pos_ + 1] >= '0' && s_[pos_ + 1] <= '9') {
      fail("leading zeros are not allowed in JSON numbers");
    }
    // Accumulate as a negative number so that INT64_MIN is representable.
    int64_t acc = 0;
    while (peek() >= '0' && peek() <= '9') {
      int d = peek() - '0';
      if (acc < (INT64_MIN + d) / 10) fail("integer out of the 64-bit range");
      acc = acc * 10 - d;
      ++pos_;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') fail("only integers are allowed, not fractions or exponents");
    if (!negative) {
      if (acc == INT64_MIN) fail("integer out of the 64-bit range");
      acc = -acc;
    }
    v.integer = acc;
    return v;
  }

  uint32_t parse_hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_];
      uint32_t d;
      if (c >= '0' && c <= '9') d = static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = static_cast<uint32_t>(c - 'A' + 10);
      else fail("expected 4 hex digits after \\u");
      cp = cp * 16 + d;
      ++pos_;
    }
    return cp;
  }

  // Copies one UTF-8 sequence starting at pos_, refusing overlong forms, surrogates and code points
  // above U+10FFFF (RFC 3629).
  void copy_utf8(std::string& out) {
    const auto [cp, len] = decode_utf8(s_, pos_);
    if (len == 0) {
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      const size_t want = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
      fail(want != 0 && s_.size() - pos_ < want ? "truncated UTF-8 sequence in a string" : "invalid UTF-8 in a string");
    }
    out.append(s_.substr(pos_, static_cast<size_t>(len)));
    pos_ += static_cast<size_t>(len);
  }

  std::string parse_string() {
    ++pos_;  // '"'
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("unescaped control character in a string");
      if (c != '\\') {
        copy_utf8(out);
        continue;
      }
      ++pos_;
      if (at_end()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.size() - pos_ < 2 || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') {
              fail("unpaired high surrogate in a \\u escape");
            }
            pos_ += 2;
            uint32_t lo = parse_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("a high surrogate must be followed by a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, static_cast<char32_t>(cp));
          break;
        }
        default:
          --pos_;
          fail("unknown escape in a string");
      }
    }
  }

  std::string_view s_;
  std::string_view where_;
  size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(std::string_view key) const {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] == key) return &values[i];
  }
  return nullptr;
}

const char* json_kind_name(JsonValue::Kind k) {
  switch (k) {
    case JsonValue::Kind::kObject: return "object";
    case JsonValue::Kind::kArray: return "array";
    case JsonValue::Kind::kString: return "string";
    case JsonValue::Kind::kInteger: return "integer";
  }
  return "?";
}

JsonValue parse_json(std::string_view text, std::string_view where) { return Parser(text, where).parse_document(); }

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

std::string json_object(const std::map<std::string, std::string>& fields) {
  std::string s = "{";
  bool first = true;
  for (const auto& [k, v] : fields) {
    s += (first ? "" : ",") + json_quote(k) + ":" + v;
    first = false;
  }
  return s + "}";
}

}  // namespace demi::io::internal
