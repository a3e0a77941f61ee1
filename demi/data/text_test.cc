// Tests of TextVocab and TextDataset: vocabularies built, stored and parsed back; encode/decode round trips
// (multi-byte UTF-8 included); hostile input refused with the byte offset or the character; windows that
// are next-token pairs, deterministic per (seed, epoch, row), inside their split; and the pipeline
// (batch, prefetch) over it.
#include "demi/data/text.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "demi/data/internal/test_util.h"
#include "demi/data/iterator.h"

namespace demi::data {
namespace {

using test_util::expect_error;
using test_util::TempDir;

std::filesystem::path write_text(const TempDir& dir, const std::string& name, const std::string& text) {
  std::filesystem::path p = dir / name;
  test_util::write_bytes(p, std::vector<uint8_t>(text.begin(), text.end()));
  return p;
}

std::vector<int32_t> ints(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.data<int32_t>()[i];
  return v;
}

TEST(TextVocab, CharactersInCodePointOrderRoundTrip) {
  const std::string text = "baé\nb€a🙂";  // 1-, 2-, 3- and 4-byte characters
  TextVocab v = TextVocab::chars_of(text);
  EXPECT_EQ(v.kind(), TextVocab::Kind::kChar);
  EXPECT_EQ(v.size(), 6);  // \n a b é € 🙂
  std::vector<int32_t> ids = v.encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 1, 3, 0, 2, 4, 1, 5}));
  EXPECT_EQ(v.decode(ids), text);
  TextVocab back = TextVocab::parse(v.to_string());
  EXPECT_EQ(back.to_string(), v.to_string());
  EXPECT_EQ(back.encode(text), ids);
}

TEST(TextVocab, BytesTakeAnyFile) {
  TextVocab v = TextVocab::bytes();
  EXPECT_EQ(v.size(), 256);
  const std::string raw("\xff\x00\x80z", 4);
  std::vector<int32_t> ids = v.encode(raw);
  EXPECT_EQ(ids, (std::vector<int32_t>{255, 0, 128, 'z'}));
  EXPECT_EQ(v.decode(ids), raw);
  EXPECT_EQ(TextVocab::parse("byte").kind(), TextVocab::Kind::kByte);
}

TEST(TextVocab, HostileInputIsRefusedWithItsPosition) {
  expect_error([] { TextVocab::chars_of("ab\xc3"); }, {"invalid UTF-8 at byte 2", "0xc3"});         // truncated
  expect_error([] { TextVocab::chars_of("a\xc0\xafz"); }, {"invalid UTF-8 at byte 1"});             // overlong '/'
  expect_error([] { TextVocab::chars_of("\xed\xa0\x80"); }, {"invalid UTF-8 at byte 0"});           // a surrogate
  expect_error([] { TextVocab::chars_of("ok\x80"); }, {"invalid UTF-8 at byte 2", "byte vocabulary"});  // stray
  expect_error([] { TextVocab::chars_of(""); }, {"non-empty"});
  TextVocab v = TextVocab::chars_of("abc");
  expect_error([&] { v.encode("abz"); }, {"'z' at byte 2", "character vocabulary of 3 characters"});
  expect_error([&] { v.decode(std::vector<int32_t>{0, 3}); }, {"token id 3", "vocabulary of 3"});
  expect_error([&] { v.decode(std::vector<int32_t>{-1}); }, {"token id -1"});
  expect_error([] { TextVocab::parse("chars:abc"); }, {"not a stored text vocabulary"});
  expect_error([] { TextVocab::parse("char:ba"); }, {"code-point order"});
  expect_error([] { TextVocab::parse("char:aab"); }, {"repeats"});
}

TEST(TextDataset, WindowsAreNextTokenPairsDeterministicPerSeedAndEpoch) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 500; ++i) text += static_cast<char>('a' + i % 26);
  const auto path = write_text(dir, "t.txt", text).string();
  TextVocab vocab = TextVocab::chars_of(text);
  TextDatasetOptions o{.block_size = 16, .split = "train", .windows = 40, .seed = 7};
  TextDataset ds(path, vocab, o);
  EXPECT_EQ(ds.get_dataset_size(), 40);
  EXPECT_EQ(ds.total_tokens(), 500);
  EXPECT_EQ(ds.num_tokens(), 450);
  std::set<int32_t> firsts;
  for (int64_t i = 0; i < 40; ++i) {
    Row r = ds.get_row(i, 0);
    ASSERT_EQ(r.size(), 2u);
    ASSERT_EQ(r[0].shape(), Shape({16}));
    ASSERT_EQ(r[0].dtype(), DType::kI32);
    std::vector<int32_t> x = ints(r[0]), y = ints(r[1]);
    for (int k = 0; k < 16; ++k) {
      EXPECT_EQ((x[static_cast<size_t>(k)] + 1) % 26, y[static_cast<size_t>(k)]) << "row " << i << " position " << k;
      if (k > 0) {
        EXPECT_EQ(x[static_cast<size_t>(k)], y[static_cast<size_t>(k - 1)]);
      }
    }
    firsts.insert(x[0]);
    EXPECT_EQ(ints(ds.get_row(i, 0)[0]), x) << "the same (seed, epoch, row) gives the same window";
  }
  EXPECT_GT(firsts.size(), 10u) << "windows start at random positions";
  int differ = 0;
  for (int64_t i = 0; i < 40; ++i) differ += ints(ds.get_row(i, 1)[0]) != ints(ds.get_row(i, 0)[0]);
  EXPECT_GT(differ, 30) << "another epoch draws other windows";
  TextDataset other(path, vocab, {.block_size = 16, .split = "train", .windows = 40, .seed = 8});
  differ = 0;
  for (int64_t i = 0; i < 40; ++i) differ += ints(other.get_row(i, 0)[0]) != ints(ds.get_row(i, 0)[0]);
  EXPECT_GT(differ, 30) << "another seed draws other windows";
}

// The first 90% of the tokens are 'a', the rest 'b': every train window (inputs and targets) is all 'a',
// every validation window all 'b'.
TEST(TextDataset, SplitsDoNotOverlap) {
  TempDir dir;
  const std::string text = std::string(900, 'a') + std::string(100, 'b');
  const auto path = write_text(dir, "split.txt", text).string();
  TextVocab vocab = TextVocab::chars_of(text);
  for (const char* split : {"train", "valid"}) {
    TextDataset ds(path, vocab, {.block_size = 32, .split = split, .windows = 200, .seed = 3});
    const int32_t want = std::string(split) == "train" ? 0 : 1;
    for (int64_t i = 0; i < 200; ++i)
      for (const Tensor& t : ds.get_row(i, 0))
        for (int32_t id : ints(t)) ASSERT_EQ(id, want) << split << " row " << i;
  }
  TextDataset all(path, vocab, {.block_size = 32, .split = "all", .windows = 1});
  EXPECT_EQ(all.num_tokens(), 1000);
}

TEST(TextDataset, BatchesThroughThePrefetchingPipeline) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "xyz "[i % 4];
  const auto path = write_text(dir, "b.txt", text).string();
  auto ds = std::make_shared<TextDataset>(path, TextVocab::bytes(),
                                          TextDatasetOptions{.block_size = 8, .windows = 12, .seed = 1})
                ->batch(4);
  for (int prefetch : {0, 2}) {
    auto it = ds->create_iterator({.prefetch = prefetch, .num_epochs = 1});
    int batches = 0;
    while (auto b = it->next()) {
      ASSERT_EQ((*b)[0].shape(), Shape({4, 8}));
      ASSERT_EQ((*b)[1].shape(), Shape({4, 8}));
      EXPECT_GE(ints((*b)[0])[0], ' ');  // byte ids are the bytes
      ++batches;
    }
    EXPECT_EQ(batches, 3);
  }
}

TEST(TextDataset, BadFilesAndOptionsAreClearErrors) {
  TempDir dir;
  const auto small = write_text(dir, "small.txt", "abcdefghij").string();
  TextVocab v = TextVocab::chars_of("abcdefghij");
  expect_error([&] { (void)TextDataset(small, v, {.block_size = 16, .windows = 1}); },
               {"small.txt", "train split holds 9 tokens", "block_size + 1 = 17"});
  expect_error([&] { (void)TextDataset((dir / "missing.txt").string(), v, {.windows = 1}); }, {"missing.txt", "cannot open"});
  expect_error([&] { (void)TextDataset(dir.str(), v, {.windows = 1}); }, {"not a regular file"});
  expect_error([&] { (void)TextDataset(small, v, {.block_size = 2, .windows = 0}); }, {"windows", ">= 1"});
  expect_error([&] { (void)TextDataset(small, v, {.block_size = 2, .split = "test", .windows = 1}); }, {"split must be"});
  expect_error([&] { (void)TextDataset(small, v, {.block_size = 0, .windows = 1}); }, {"block_size must be >= 1"});
  // A character the vocabulary lacks (a vocabulary from another text), and invalid UTF-8.
  const auto other = write_text(dir, "other.txt", std::string(50, 'a') + "Z" + std::string(50, 'a')).string();
  expect_error([&] { (void)TextDataset(other, v, {.block_size = 4, .windows = 1}); }, {"other.txt", "'Z' at byte 50"});
  const auto bad = write_text(dir, "bad.txt", std::string(40, 'a') + "\xfe" + std::string(40, 'a')).string();
  expect_error([&] { TextVocab::chars_of_file(bad); }, {"bad.txt", "invalid UTF-8 at byte 40"});
  expect_error([&] { (void)TextDataset(bad, v, {.block_size = 4, .windows = 1}); }, {"bad.txt", "invalid UTF-8 at byte 40"});
  // A byte vocabulary reads the same file fine.
  TextDataset bytes(bad, TextVocab::bytes(), {.block_size = 4, .windows = 2});
  EXPECT_EQ(bytes.total_tokens(), 81);
}

}  // namespace
}  // namespace demi::data
