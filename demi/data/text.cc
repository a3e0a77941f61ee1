#include "demi/data/text.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/core/utf8.h"
#include "demi/data/internal/util.h"

namespace demi::data {
namespace {

inline constexpr uint64_t kSaltText = 0x54455854ull;  // "TEXT"

// "'a'", "U+000A", "byte 0xff"
std::string char_name(char32_t cp) {
  if (cp >= 0x20 && cp < 0x7F) return std::string("'") + static_cast<char>(cp) + "'";
  char b[16];
  std::snprintf(b, sizeof b, "U+%04X", static_cast<unsigned>(cp));
  return b;
}

template <typename F>
void for_each_char(std::string_view s, const std::string& what, F&& f) {
  for (size_t pos = 0; pos < s.size();) {
    auto [cp, len] = decode_utf8(s, pos);
    if (len == 0) {
      char b[8];
      std::snprintf(b, sizeof b, "0x%02x", static_cast<unsigned>(static_cast<uint8_t>(s[pos])));
      throw Error(str_cat(what, ": invalid UTF-8 at byte ", pos, " (", b,
                          "); a character vocabulary needs UTF-8 text (a byte vocabulary takes any file)"));
    }
    f(cp, pos);
    pos += static_cast<size_t>(len);
  }
}

// The whole file, for building a vocabulary (read once; the dataset maps it).
std::string read_text_file(const std::string& path) {
  struct stat st {};  // (checked before opening: a FIFO would block the open, a directory reads as empty)
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw Error(str_cat("text file ", path, " is ", S_ISDIR(st.st_mode) ? "a directory, not a regular file" : "not a regular file",
                        ": give the path of a text file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str_cat("cannot open text file ", path, ": ", std::strerror(errno)));
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw Error(str_cat("cannot read text file ", path));
  return os.str();
}

}  // namespace

// ---- TextVocab ----
TextVocab TextVocab::bytes() { return TextVocab(); }

TextVocab TextVocab::chars_of(std::string_view text, const std::string& what) {
  DEMI_CHECK(!text.empty(), what, ": a character vocabulary needs a non-empty text");
  std::vector<bool> seen_small(0x10000, false);
  std::vector<char32_t> large;
  for_each_char(text, what, [&](char32_t cp, size_t) {
    if (cp < 0x10000)
      seen_small[cp] = true;
    else
      large.push_back(cp);
  });
  TextVocab v;
  v.kind_ = Kind::kChar;
  for (char32_t c = 0; c < 0x10000; ++c)
    if (seen_small[c]) v.chars_.push_back(c);
  std::sort(large.begin(), large.end());
  large.erase(std::unique(large.begin(), large.end()), large.end());
  v.chars_.insert(v.chars_.end(), large.begin(), large.end());
  v.ascii_.assign(128, -1);
  for (size_t i = 0; i < v.chars_.size(); ++i)
    if (v.chars_[i] < 128) v.ascii_[v.chars_[i]] = static_cast<int32_t>(i);
  return v;
}

TextVocab TextVocab::chars_of_file(const std::string& path) { return chars_of(read_text_file(path), path); }

TextVocab TextVocab::parse(std::string_view stored) {
  if (stored == "byte") return bytes();
  DEMI_CHECK(stored.starts_with("char:") && stored.size() > 5, "not a stored text vocabulary: '",
             stored.substr(0, 40), "' (expected \"byte\" or \"char:\" and its characters)");
  TextVocab v = chars_of(stored.substr(5), "stored vocabulary");
  // chars_of sorts and deduplicates: a stored list that was not already so is not one demi wrote.
  std::string round_trip = v.to_string();
  DEMI_CHECK(round_trip == stored, "stored text vocabulary is not in code-point order or repeats a character");
  return v;
}

std::string TextVocab::to_string() const {
  if (kind_ == Kind::kByte) return "byte";
  std::string s = "char:";
  for (char32_t c : chars_) append_utf8(s, c);
  return s;
}

std::string TextVocab::describe() const {
  return kind_ == Kind::kByte ? std::string("byte vocabulary (256)")
                              : str_cat("character vocabulary of ", chars_.size(), " characters");
}

int32_t TextVocab::id_of(char32_t c) const {
  if (c < 128) return ascii_[c];
  auto it = std::lower_bound(chars_.begin(), chars_.end(), c);
  return it != chars_.end() && *it == c ? static_cast<int32_t>(it - chars_.begin()) : -1;
}

std::vector<int32_t> TextVocab::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  if (kind_ == Kind::kByte) {
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
    return ids;
  }
  for_each_char(text, "text to encode", [&](char32_t cp, size_t pos) {
    const int32_t id = id_of(cp);
    DEMI_CHECK(id >= 0, "character ", char_name(cp), " at byte ", pos, " is not in the ", describe(),
               " (the vocabulary comes from the training text)");
    ids.push_back(id);
  });
  return ids;
}

std::string TextVocab::decode(std::span<const int32_t> ids) const {
  std::string s;
  s.reserve(ids.size());
  for (int32_t id : ids) {
    DEMI_CHECK(id >= 0 && id < size(), "token id ", id, " is outside the ", describe());
    if (kind_ == Kind::kByte)
      s += static_cast<char>(static_cast<uint8_t>(id));
    else
      append_utf8(s, chars_[static_cast<size_t>(id)]);
  }
  return s;
}

// ---- TextDataset ----
TextDataset::TextDataset(const std::string& path, const TextVocab& vocab, const TextDatasetOptions& options)
    : Dataset({"tokens", "targets"}), path_(path), vocab_(vocab), options_(options),
      seed_(options.seed.value_or(default_data_seed())) {
  DEMI_CHECK(options.block_size >= 1, "TextDataset(", path, "): block_size must be >= 1, got ", options.block_size);
  DEMI_CHECK(options.windows >= 1, "TextDataset(", path, "): windows (rows per epoch) must be >= 1, got ",
             options.windows);
  DEMI_CHECK(options.train_fraction > 0 && options.train_fraction < 1, "TextDataset(", path,
             "): train_fraction must be in (0, 1), got ", options.train_fraction);
  DEMI_CHECK(options.split == "train" || options.split == "valid" || options.split == "all", "TextDataset(", path,
             "): split must be \"train\", \"valid\" or \"all\", got \"", options.split, "\"");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // (a FIFO: refused, never waited on)
  if (fd < 0) throw Error(str_cat("cannot open text file ", path, ": ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(str_cat("text file ", path, " is ", S_ISDIR(st.st_mode) ? "a directory, not a regular file" : "not a regular file",
                        ": give the path of a text file"));
  }
  map_bytes_ = static_cast<size_t>(st.st_size);
  if (map_bytes_ > 0) {
    map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map_ == MAP_FAILED) {
      const int err = errno;
      map_ = nullptr;
      ::close(fd);
      throw Error(str_cat("cannot map text file ", path, ": ", std::strerror(err)));
    }
  }
  ::close(fd);
  const std::string_view text(static_cast<const char*>(map_), map_bytes_);
  try {
    if (vocab_.kind() == TextVocab::Kind::kByte) {
      bytes_ = static_cast<const uint8_t*>(map_);
      total_ = static_cast<int64_t>(map_bytes_);
    } else {
      std::vector<int32_t> ids = vocab_.encode(text);
      total_ = static_cast<int64_t>(ids.size());
      MemCategoryScope scope(MemCategory::kData);
      ids_ = empty({total_}, vocab_.size() <= 256 ? DType::kU8 : DType::kI32);
      if (ids_.dtype() == DType::kU8)
        std::transform(ids.begin(), ids.end(), ids_.data<uint8_t>(), [](int32_t i) { return static_cast<uint8_t>(i); });
      else
        std::copy(ids.begin(), ids.end(), ids_.data<int32_t>());
      ::munmap(map_, map_bytes_);  // decoded: the mapping is no longer read
      map_ = nullptr;
    }
  } catch (const Error& e) {
    if (map_) ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw Error(str_cat("TextDataset(", path, "): ", e.what()));
  }
  const int64_t cut = static_cast<int64_t>(static_cast<double>(total_) * options.train_fraction);
  begin_ = options.split == "valid" ? cut : 0;
  end_ = options.split == "train" ? cut : total_;
  DEMI_CHECK(end_ - begin_ >= options.block_size + 1, "TextDataset(", path, "): the ", options.split, " split holds ",
             end_ - begin_, " tokens, fewer than one window of block_size + 1 = ", options.block_size + 1,
             " (the file has ", total_, " tokens)");
}

TextDataset::~TextDataset() {
  if (map_) ::munmap(map_, map_bytes_);
}

std::string TextDataset::describe() const {
  return str_cat("TextDataset(", path_, ", ", options_.split, ", block_size ", options_.block_size, ", ",
                 vocab_.describe(), ")");
}

int32_t TextDataset::token(int64_t i) const {
  if (bytes_) return bytes_[i];
  return ids_.dtype() == DType::kU8 ? ids_.data<uint8_t>()[i] : ids_.data<int32_t>()[i];
}

Row TextDataset::get_row(int64_t index, int64_t epoch) const {
  DEMI_CHECK(index >= 0 && index < options_.windows, describe(), ": row ", index, " of ", options_.windows);
  Generator g(internal::mix_seed(seed_, kSaltText, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)));
  const int64_t t = options_.block_size;
  const int64_t start = begin_ + g.next_int(end_ - begin_ - t);  // the window and its next token fit
  Tensor tokens = empty({t}, DType::kI32), targets = empty({t}, DType::kI32);
  int32_t* x = tokens.data<int32_t>();
  int32_t* y = targets.data<int32_t>();
  for (int64_t i = 0; i < t; ++i) {
    x[i] = token(start + i);
    y[i] = token(start + i + 1);
  }
  return {tokens, targets};
}

}  // namespace demi::data
