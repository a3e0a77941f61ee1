// Text for language models: a vocabulary built from a file (bytes, or the file's distinct characters) and
// TextDataset, random windows of a token stream for next-token prediction (nanoGPT's get_batch).
//
//   data::TextVocab vocab = data::TextVocab::chars_of_file("kjv.txt");
//   auto train = std::make_shared<data::TextDataset>("kjv.txt", vocab,
//                    data::TextDatasetOptions{.block_size = 128, .split = "train", .windows = 64 * 500})
//                    ->batch(64);
//   // rows: "tokens" (128) int32 and "targets" (128) int32, the same window shifted by one token
//
// The file is memory-mapped. With a byte vocabulary the mapping is the token stream (no copy); with a
// character vocabulary the file is decoded once into one byte (or int32, past 256 characters) per
// character. The split is deterministic: "train" is the first train_fraction of the tokens, "valid" the
// rest (nanoGPT's 90/10). Row i of epoch e starts at a position drawn from demi's counter-based generator
// keyed by (seed, epoch, i), so a seed gives the same windows whatever the threads and prefetching, and a
// resumed run continues with the windows it would have drawn; an evaluation pass (epoch 0) sees the same
// windows every time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "demi/data/dataset.h"

namespace demi::data {

class TextVocab {
 public:
  enum class Kind { kByte, kChar };
  // The 256 byte values: any file, ids are bytes.
  static TextVocab bytes();
  // The distinct Unicode characters of UTF-8 `text`, in code-point order (a demi::Error names the byte
  // offset of invalid UTF-8).
  static TextVocab chars_of(std::string_view text, const std::string& what = "text");
  static TextVocab chars_of_file(const std::string& path);
  // The form to_string() writes: "byte", or "char:" followed by the characters in id order (UTF-8).
  static TextVocab parse(std::string_view stored);
  std::string to_string() const;

  Kind kind() const { return kind_; }
  int64_t size() const { return kind_ == Kind::kByte ? 256 : static_cast<int64_t>(chars_.size()); }
  // Ids of `text`; a character outside the vocabulary is a demi::Error naming it and its offset.
  std::vector<int32_t> encode(std::string_view text) const;
  // The text of `ids` (each in [0, size()), else a demi::Error). Byte ids that do not form UTF-8 are
  // written as they are.
  std::string decode(std::span<const int32_t> ids) const;
  // "character vocabulary of 75 characters" / "byte vocabulary (256)"
  std::string describe() const;

 private:
  Kind kind_ = Kind::kByte;
  std::vector<char32_t> chars_;  // kChar: id -> code point, ascending
  std::vector<int32_t> ascii_;   // kChar: code point < 128 -> id (-1: none), a fast path for encode
  int32_t id_of(char32_t c) const;
};

struct TextDatasetOptions {
  int64_t block_size = 128;     // tokens per window (the row holds block_size inputs and targets)
  std::string split = "train";  // "train", "valid" or "all"
  double train_fraction = 0.9;  // the train part; valid is the rest
  int64_t windows = 0;          // rows per epoch (required, >= 1)
  std::optional<uint64_t> seed = std::nullopt;  // default: the global seed (demi::set_seed)
};

class TextDataset final : public Dataset {
 public:
  TextDataset(const std::string& path, const TextVocab& vocab, const TextDatasetOptions& options);
  ~TextDataset() override;

  std::string describe() const override;
  bool is_random_access() const override { return true; }
  Row get_row(int64_t index, int64_t epoch) const override;

  const TextVocab& vocab() const { return vocab_; }
  int64_t num_tokens() const { return end_ - begin_; }  // of this split
  int64_t total_tokens() const { return total_; }        // of the whole file

 protected:
  int64_t compute_size() const override { return options_.windows; }

 private:
  int32_t token(int64_t i) const;

  std::string path_;
  TextVocab vocab_;
  TextDatasetOptions options_;
  uint64_t seed_;
  void* map_ = nullptr;  // the file's mapping
  size_t map_bytes_ = 0;
  const uint8_t* bytes_ = nullptr;  // byte vocabulary: the mapping
  Tensor ids_;                      // character vocabulary: uint8 or int32 ids
  int64_t total_ = 0, begin_ = 0, end_ = 0;
};

}  // namespace demi::data
