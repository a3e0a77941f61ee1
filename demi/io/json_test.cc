// The strict header JSON parser: what it accepts, and that each thing outside the safetensors subset is
// refused with the byte offset.
#include "demi/io/internal/json.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "demi/io/internal/test_util.h"

namespace demi::io::internal {
namespace {

using test_util::expect_error;

TEST(Json, ParsesObjectsArraysStringsIntegers) {
  JsonValue v = parse_json(R"( {"a": [1, -2, 0], "b": {"c": "x\"y\\z\n\u00e9\ud83d\ude00"}, "d": []} )", "t");
  ASSERT_EQ(v.kind, JsonValue::Kind::kObject);
  ASSERT_EQ(v.keys.size(), 3u);
  ASSERT_EQ(v.values.size(), 3u);
  EXPECT_EQ(v.keys[0], "a");  // document order is kept
  const JsonValue* a = v.find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 3u);
  EXPECT_EQ(a->items[1].integer, -2);
  EXPECT_EQ(v.find("b")->find("c")->string, "x\"y\\z\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v.find("d")->items.empty());
  EXPECT_EQ(v.find("zz"), nullptr);
}

TEST(Json, IntegerLimitsAreExact) {
  EXPECT_EQ(parse_json("[9223372036854775807]", "t").items[0].integer, INT64_MAX);
  EXPECT_EQ(parse_json("[-9223372036854775808]", "t").items[0].integer, INT64_MIN);
  expect_error([] { parse_json("[9223372036854775808]", "t"); }, {"t: invalid JSON at byte", "64-bit range"});
  expect_error([] { parse_json("[-9223372036854775809]", "t"); }, {"64-bit range"});
  expect_error([] { parse_json("[99999999999999999999999]", "t"); }, {"64-bit range"});
}

TEST(Json, RefusesEverythingOutsideTheSubset) {
  struct Case {
    const char* text;
    const char* why;
  };
  const Case cases[] = {
      {"", "expected an object"},
      {"{", "expected a string key"},
      {"{\"a\":1", "expected '}'"},
      {"{\"a\":1,}", "expected a string key"},
      {"[1,]", "expected an object, array, string or integer"},
      {"{\"a\" 1}", "expected ':'"},
      {"{a:1}", "expected a string key"},
      {"[1.5]", "only integers"},
      {"[1e3]", "only integers"},
      {"[01]", "leading zeros"},
      {"[-]", "expected a digit"},
      {"[true]", "expected an object"},
      {"[null]", "expected an object"},
      {"{\"a\":1,\"a\":2}", "duplicate key \"a\""},
      {"{} x", "unexpected content after"},
      {"\"abc", "unterminated string"},
      {"[\"a\tb\"]", "unescaped control character"},
      {"[\"\\x\"]", "unknown escape"},
      {"[\"\\u12\"]", "4 hex digits"},
      {"[\"\\ud800\"]", "unpaired high surrogate"},
      {"[\"\\udc00\"]", "unpaired low surrogate"},
      {"[\"\\ud800\\u0041\"]", "followed by a low one"},
      {"[\"\xff\"]", "invalid UTF-8"},
      {"[\"\xc0\xaf\"]", "invalid UTF-8"},          // overlong '/'
      {"[\"\xed\xa0\x80\"]", "invalid UTF-8"},      // an encoded surrogate
      {"[\"\xe2\x82\"]", "invalid UTF-8"},          // truncated, then a quote
      {"[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]", "nesting deeper than"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    expect_error([&] { parse_json(c.text, "hdr"); }, {"hdr: invalid JSON at byte", c.why});
  }
}

TEST(Json, QuoteRoundTrips) {
  std::string s = "a\"b\\c\n\x01\xc3\xa9";
  JsonValue v = parse_json(str_cat("[", json_quote(s), "]"), "t");
  EXPECT_EQ(v.items[0].string, s);
  EXPECT_EQ(json_quote("\x1f"), "\"\\u001f\"");
}

}  // namespace
}  // namespace demi::io::internal

namespace demi::io::internal {
namespace {

// An object of n members, keys "k0".."k{n-1}".
std::string object_of(int n) {
  std::string s = "{";
  for (int i = 0; i < n; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
  return s + "}";
}

// A header of 1.5M members (the hostile safetensors header that hung): parsed, each key kept, and a
// duplicate among them found. The duplicate-key check is a hash lookup per key; the linear search it
// replaced made this input take most of an hour (8.6 s at 100k members, growing with the square), so a
// regression fails here by never finishing, not by a timing this test would have to assert.
TEST(Json, AHeaderOfMillionsOfMembersParses) {
  const std::string text = object_of(1500000);
  const JsonValue v = parse_json(text, "test");
  EXPECT_EQ(v.keys.size(), 1500000u);
  EXPECT_EQ(v.keys.back(), "k1499999");
  const std::string dup = text.substr(0, text.size() - 1) + ",\"k777\":2}";
  EXPECT_THROW(parse_json(dup, "test"), Error);
  EXPECT_THROW(parse_json("{\"a\":1,\"b\":2,\"a\":3}", "test"), Error);
}

}  // namespace
}  // namespace demi::io::internal
