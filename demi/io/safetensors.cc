// safetensors reading and writing; see safetensors.h for the format and what demi adds to it. Reading
// goes through a ByteSource (a buffer or a file read with pread) so that the fuzz target and
// load_safetensors run exactly the same validation, and a file's tensors are read straight into their
// storage without first holding the whole file in memory.
#include "demi/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <set>

#include "demi/core/error.h"
#include "demi/io/internal/json.h"

namespace demi::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; demi reads and writes it with plain copies");

namespace {

using internal::JsonValue;

struct DTypeCode {
  DType dtype;
  std::string_view code;
};
constexpr DTypeCode kCodes[] = {
    {DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"}, {DType::kF64, "F64"},
    {DType::kI64, "I64"}, {DType::kI32, "I32"}, {DType::kU8, "U8"},     {DType::kBool, "BOOL"},
};
static_assert(std::size(kCodes) == kNumDTypes, "every demi dtype needs a safetensors code");
// Valid safetensors dtypes that demi has no dtype for: refused with a message saying so.
constexpr std::string_view kOtherCodes[] = {"I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2",
                                            "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"};

std::string known_codes() {
  std::string s;
  for (const auto& c : kCodes) s += str_cat(s.empty() ? "" : ", ", c.code);
  return s;
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  return static_cast<uint32_t>(::crc32_z(crc, static_cast<const Bytef*>(data), n));
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::string dims_string(const Shape& s) {
  std::string out;
  for (int i = 0; i < s.rank(); ++i) out += str_cat(i ? "," : "", s[i]);
  return out;
}

// The canonical description of a header that demi.header_crc32 covers (see safetensors.h).
uint32_t header_crc(std::vector<const TensorInfo*> tensors, const Metadata& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->name < b->name; });
  std::string s;
  for (const TensorInfo* t : tensors) {
    s += t->name;
    s += '\0';
    s += safetensors_dtype_code(t->dtype);
    s += '\0';
    s += dims_string(t->shape);
    s += '\0';
    s += std::to_string(t->begin);
    s += '\0';
    s += std::to_string(t->end);
    s += '\n';
  }
  for (const auto& [k, v] : metadata) {  // std::map: sorted by key
    if (k == kHeaderCrcKey) continue;
    s += k;
    s += '\0';
    s += v;
    s += '\n';
  }
  return crc32_update(0, s.data(), s.size());
}

// Where the bytes come from: memory (fuzzing, tests) or a file (pread, so tensors go straight into
// their storage).
class ByteSource {
 public:
  explicit ByteSource(std::string name) : name_(std::move(name)) {}
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly n bytes at `offset` (validated by the caller against size()).
  virtual void read(uint64_t offset, void* dst, size_t n) = 0;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(std::span<const uint8_t> bytes, std::string name) : ByteSource(std::move(name)), bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, void* dst, size_t n) override {
    DEMI_ASSERT(offset <= bytes_.size() && n <= bytes_.size() - offset, "read past the end of a buffer");
    if (n > 0) std::memcpy(dst, bytes_.data() + offset, n);
  }

 private:
  std::span<const uint8_t> bytes_;
};

class FileSource final : public ByteSource {
 public:
  explicit FileSource(const std::filesystem::path& path) : ByteSource(path.string()) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // (a FIFO: refused below, never waited on)
    if (fd_ < 0) {
      int err = errno;
      throw Error(str_cat("cannot read '", name(), "': ", std::strerror(err)));
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      int err = errno;
      ::close(fd_);
      throw Error(str_cat("cannot read '", name(), "': ", std::strerror(err)));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw Error(str_cat("cannot read '", name(), "': ",
                          S_ISDIR(st.st_mode) ? "is a directory, expected a safetensors file" : "not a regular file"));
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileSource() override { ::close(fd_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* dst, size_t n) override {
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        int err = errno;
        throw Error(str_cat("cannot read '", name(), "' at byte ", offset, ": ",
                            got == 0 ? "the file is shorter than when it was opened" : std::strerror(err)));
      }
      p += got;
      n -= static_cast<size_t>(got);
      offset += static_cast<uint64_t>(got);
    }
  }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw Error(str_cat(file, ": ", what));
}
[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor, const std::string& what) {
  throw Error(str_cat(file, ": tensor '", tensor, "': ", what));
}

int64_t non_negative_int(const std::string& file, const std::string& tensor, const JsonValue& v,
                         const char* what) {
  if (v.kind != JsonValue::Kind::kInteger) {
    fail_tensor(file, tensor, str_cat(what, " must be an integer, got a JSON ", internal::json_kind_name(v.kind)));
  }
  if (v.integer < 0) fail_tensor(file, tensor, str_cat(what, " must not be negative, got ", v.integer));
  return v.integer;
}

TensorInfo parse_entry(const std::string& file, const std::string& name, const JsonValue& entry,
                       uint64_t data_size) {
  if (name.empty()) fail(file, "a tensor has an empty name");
  if (entry.kind != JsonValue::Kind::kObject) {
    fail_tensor(file, name, str_cat("expected an object {dtype, shape, data_offsets}, got a JSON ",
                                    internal::json_kind_name(entry.kind)));
  }
  for (const std::string& k : entry.keys) {
    if (k != "dtype" && k != "shape" && k != "data_offsets") {
      fail_tensor(file, name, str_cat("unexpected key ", internal::json_quote(k),
                                      " (an entry has only dtype, shape and data_offsets)"));
    }
  }
  const JsonValue* dtype = entry.find("dtype");
  const JsonValue* shape = entry.find("shape");
  const JsonValue* offsets = entry.find("data_offsets");
  if (!dtype) fail_tensor(file, name, "no \"dtype\"");
  if (!shape) fail_tensor(file, name, "no \"shape\"");
  if (!offsets) fail_tensor(file, name, "no \"data_offsets\"");

  TensorInfo info;
  info.name = name;
  if (dtype->kind != JsonValue::Kind::kString) fail_tensor(file, name, "\"dtype\" must be a string");
  auto dt = parse_safetensors_dtype(dtype->string);
  if (!dt) {
    bool valid_elsewhere = std::find(std::begin(kOtherCodes), std::end(kOtherCodes), dtype->string) != std::end(kOtherCodes);
    fail_tensor(file, name, str_cat(valid_elsewhere ? "dtype " : "unknown dtype ", internal::json_quote(dtype->string),
                                    valid_elsewhere ? " is not one demi supports" : "", " (demi reads ",
                                    known_codes(), ")"));
  }
  info.dtype = *dt;

  if (shape->kind != JsonValue::Kind::kArray) fail_tensor(file, name, "\"shape\" must be an array of integers");
  if (shape->items.size() > static_cast<size_t>(Shape::kMaxRank)) {
    fail_tensor(file, name, str_cat("shape has ", shape->items.size(), " dimensions; demi supports at most ",
                                     Shape::kMaxRank));
  }
  // numel * element size, overflow-checked: a shape like [2^32, 2^32] must not wrap to something small
  // that happens to match its byte range. The product of the non-zero dimensions is bounded too (even
  // when another dimension is 0), so that no prefix product anywhere in demi can overflow.
  uint64_t nonzero_bytes = dtype_size(info.dtype);
  bool overflow = false, has_zero = false;
  for (const JsonValue& d : shape->items) {
    int64_t dim = non_negative_int(file, name, d, "a shape dimension");
    info.shape.push_back(dim);
    if (dim == 0) {
      has_zero = true;
      continue;
    }
    if (nonzero_bytes > static_cast<uint64_t>(INT64_MAX) / static_cast<uint64_t>(dim)) overflow = true;
    if (!overflow) nonzero_bytes *= static_cast<uint64_t>(dim);
  }
  uint64_t bytes = has_zero ? 0 : nonzero_bytes;
  if (overflow) {
    fail_tensor(file, name, str_cat("shape ", info.shape, " of ", safetensors_dtype_code(info.dtype),
                                    " overflows 64-bit byte arithmetic"));
  }

  if (offsets->kind != JsonValue::Kind::kArray || offsets->items.size() != 2) {
    fail_tensor(file, name, "\"data_offsets\" must be an array of two integers [begin, end]");
  }
  info.begin = static_cast<uint64_t>(non_negative_int(file, name, offsets->items[0], "data_offsets begin"));
  info.end = static_cast<uint64_t>(non_negative_int(file, name, offsets->items[1], "data_offsets end"));
  if (info.end < info.begin) {
    fail_tensor(file, name, str_cat("data_offsets [", info.begin, ", ", info.end, "] end before they begin"));
  }
  if (info.end > data_size) {
    fail_tensor(file, name, str_cat("data_offsets [", info.begin, ", ", info.end,
                                    "] are out of bounds: the data section holds ", data_size, " bytes"));
  }
  if (info.end - info.begin != bytes) {
    fail_tensor(file, name, str_cat("shape ", info.shape, " of ", safetensors_dtype_code(info.dtype), " needs ", bytes,
                                    " bytes but data_offsets [", info.begin, ", ", info.end, "] hold ",
                                    info.end - info.begin));
  }
  return info;
}

SafetensorsHeader parse_header(ByteSource& src, bool verify_checksum) {
  const std::string& file = src.name();
  uint64_t size = src.size();
  if (size < 8) fail(file, str_cat("not a safetensors file: ", size, " bytes, fewer than the 8-byte header length"));
  uint8_t len_bytes[8];
  src.read(0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeaderBytes) {
    fail(file, str_cat("header length ", n, " is absurd (the limit is ", kMaxHeaderBytes,
                       " bytes); not a safetensors file or a corrupt one"));
  }
  if (n > size - 8) {
    fail(file, str_cat("header length ", n, " exceeds the file: only ", size - 8, " bytes follow the length"));
  }
  if (n < 2) fail(file, str_cat("header length ", n, " is too short to hold a JSON object"));
  std::string text(static_cast<size_t>(n), '\0');
  src.read(8, text.data(), text.size());

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  h.data_size = size - h.data_offset;
  JsonValue root = internal::parse_json(text, str_cat(file, ": header"));
  if (root.kind != JsonValue::Kind::kObject) {
    fail(file, str_cat("the header must be a JSON object, got a ", internal::json_kind_name(root.kind)));
  }
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& key = root.keys[i];
    const JsonValue& value = root.values[i];
    if (key == "__metadata__") {
      if (value.kind != JsonValue::Kind::kObject) fail(file, "__metadata__ must be an object of strings");
      for (size_t j = 0; j < value.keys.size(); ++j) {
        const std::string& mk = value.keys[j];
        const JsonValue& mv = value.values[j];
        if (mv.kind != JsonValue::Kind::kString) {
          fail(file, str_cat("__metadata__ value of ", internal::json_quote(mk), " must be a string, got a JSON ",
                             internal::json_kind_name(mv.kind)));
        }
        h.metadata.emplace(mk, mv.string);
      }
      continue;
    }
    h.tensors.push_back(parse_entry(file, key, value, h.data_size));
  }

  // The byte ranges, in offset order, must tile the data section exactly.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin < cursor) {
      fail_tensor(file, t.name, str_cat("data_offsets [", t.begin, ", ", t.end, "] overlap tensor '", prev->name,
                                        "' [", prev->begin, ", ", prev->end, "]"));
    }
    if (t.begin > cursor) {
      fail_tensor(file, t.name, str_cat("data_offsets [", t.begin, ", ", t.end, "] leave a gap of ", t.begin - cursor,
                                        " bytes after ", prev ? str_cat("tensor '", prev->name, "'") : "the header"));
    }
    cursor = t.end;
    prev = &t;
  }
  if (cursor != h.data_size) {
    fail(file, str_cat("the data section holds ", h.data_size, " bytes but the tensors cover only ", cursor,
                       " (trailing bytes after ", prev ? str_cat("tensor '", prev->name, "'") : "the header", ")"));
  }

  if (auto it = h.metadata.find(std::string(kFormatVersionKey)); it != h.metadata.end()) {
    int v = 0;
    auto [p, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
    if (ec != std::errc() || p != it->second.data() + it->second.size() || v < 1) {
      fail(file, str_cat(kFormatVersionKey, " is not a positive integer: ", internal::json_quote(it->second)));
    }
    if (v > kSafetensorsFormatVersion) {
      fail(file, str_cat("written by a newer demi: format version ", v, ", this demi reads up to ",
                         kSafetensorsFormatVersion));
    }
  }
  if (verify_checksum) {
    // demi writes both CRCs or neither. One without the other means a key name was damaged (a flipped
    // bit in "demi.header_crc32" would otherwise switch the header check off unnoticed).
    bool has_payload = h.metadata.count(std::string(kPayloadCrcKey)) > 0;
    bool has_header = h.metadata.count(std::string(kHeaderCrcKey)) > 0;
    if (has_payload != has_header) {
      fail(file, str_cat("the header has ", has_payload ? kPayloadCrcKey : kHeaderCrcKey, " but no ",
                         has_payload ? kHeaderCrcKey : kPayloadCrcKey, " (demi writes both): the file is corrupt"));
    }
    if (auto it = h.metadata.find(std::string(kHeaderCrcKey)); it != h.metadata.end()) {
      std::vector<const TensorInfo*> ptrs;
      for (const auto& t : h.tensors) ptrs.push_back(&t);
      std::string got = hex32(header_crc(ptrs, h.metadata));
      if (got != it->second) {
        fail(file, str_cat("header checksum mismatch: stored ", it->second, ", computed ", got,
                           " (a tensor's name, dtype, shape or offsets, or a metadata value, was altered: the "
                           "file is corrupt)"));
      }
    }
  }
  return h;
}

SafetensorsFile read_all(ByteSource& src, const LoadOptions& options) {
  SafetensorsHeader h = parse_header(src, options.verify_checksum);
  const std::string& file = src.name();
  SafetensorsFile out;
  out.tensors.reserve(h.tensors.size());
  uint32_t crc = 0;
  for (const TensorInfo& info : h.tensors) {
    Tensor t = empty(info.shape, info.dtype, options.category);
    size_t n = static_cast<size_t>(info.end - info.begin);
    if (n > 0) {
      src.read(h.data_offset + info.begin, t.raw_data(), n);
      crc = crc32_update(crc, t.raw_data(), n);
    }
    if (info.dtype == DType::kBool) {
      // A byte other than 0 or 1 is not a bool; reading it as one is undefined behaviour.
      const auto* b = static_cast<const uint8_t*>(t.raw_data());
      for (size_t i = 0; i < n; ++i) {
        if (b[i] > 1) fail_tensor(file, info.name, str_cat("BOOL element ", i, " holds byte ", int{b[i]}, ", not 0 or 1"));
      }
    }
    t.set_name(info.name);
    out.tensors.emplace_back(info.name, std::move(t));
  }
  if (options.verify_checksum) {
    if (auto it = h.metadata.find(std::string(kPayloadCrcKey)); it != h.metadata.end()) {
      std::string got = hex32(crc);
      if (got != it->second) {
        fail(file, str_cat("data checksum mismatch: stored ", it->second, ", computed ", got,
                           " over the ", h.data_size, " data bytes (the file is corrupt)"));
      }
      out.checksum_verified = h.metadata.count(std::string(kHeaderCrcKey)) > 0;
    }
  }
  out.metadata = std::move(h.metadata);
  return out;
}

// The header text for `tensors` laid out in order, padded with spaces so that the data section starts
// 8-byte aligned (as Hugging Face's writer does, so readers may map the file and view it in place).
std::string build_header(const NamedTensors& tensors, Metadata metadata, bool checksum, uint32_t payload_crc) {
  std::set<std::string_view> seen;
  std::vector<TensorInfo> infos;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    DEMI_CHECK(!name.empty(), "save_safetensors: a tensor has an empty name");
    DEMI_CHECK(name != "__metadata__", "save_safetensors: \"__metadata__\" is reserved and cannot name a tensor");
    DEMI_CHECK(seen.insert(name).second, "save_safetensors: two tensors are named '", name, "'");
    DEMI_CHECK(t.defined(), "save_safetensors: tensor '", name, "' is undefined (empty)");
    TensorInfo info;
    info.name = name;
    info.dtype = t.dtype();
    info.shape = t.shape();
    info.begin = offset;
    info.end = offset += t.nbytes();
    infos.push_back(std::move(info));
  }
  metadata.erase(std::string(kPayloadCrcKey));
  metadata.erase(std::string(kHeaderCrcKey));
  metadata[std::string(kFormatVersionKey)] = std::to_string(kSafetensorsFormatVersion);
  metadata.emplace("format", "pt");
  if (checksum) {
    metadata[std::string(kPayloadCrcKey)] = hex32(payload_crc);
    std::vector<const TensorInfo*> ptrs;
    for (const auto& i : infos) ptrs.push_back(&i);
    metadata[std::string(kHeaderCrcKey)] = hex32(header_crc(ptrs, metadata));
  }

  std::string h = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : metadata) {
    h += str_cat(first ? "" : ",", internal::json_quote(k), ":", internal::json_quote(v));
    first = false;
  }
  h += "}";
  for (const TensorInfo& i : infos) {
    h += str_cat(",", internal::json_quote(i.name), ":{\"dtype\":\"", safetensors_dtype_code(i.dtype), "\",\"shape\":[",
                 dims_string(i.shape), "],\"data_offsets\":[", i.begin, ",", i.end, "]}");
  }
  h += "}";
  while ((8 + h.size()) % 8 != 0) h += ' ';
  return h;
}

uint32_t payload_crc(const NamedTensors& tensors) {
  uint32_t crc = 0;
  for (const auto& [name, t] : tensors) {
    if (t.defined() && t.nbytes() > 0) crc = crc32_update(crc, t.raw_data(), t.nbytes());
  }
  return crc;
}

void put_le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

std::string_view safetensors_dtype_code(DType t) {
  for (const auto& c : kCodes) {
    if (c.dtype == t) return c.code;
  }
  DEMI_ASSERT(false, "no safetensors code for dtype ", dtype_name(t));
}

std::optional<DType> parse_safetensors_dtype(std::string_view code) {
  for (const auto& c : kCodes) {
    if (c.code == code) return c.dtype;
  }
  return std::nullopt;
}

const Tensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

std::vector<uint8_t> encode_safetensors(const NamedTensors& tensors, const Metadata& metadata, bool checksum) {
  std::string header = build_header(tensors, metadata, checksum, checksum ? payload_crc(tensors) : 0);
  uint64_t total = 8 + header.size();
  for (const auto& [name, t] : tensors) total += t.nbytes();
  std::vector<uint8_t> out(static_cast<size_t>(total));
  put_le64(out.data(), header.size());
  std::memcpy(out.data() + 8, header.data(), header.size());
  size_t at = 8 + header.size();
  for (const auto& [name, t] : tensors) {
    if (t.nbytes() > 0) std::memcpy(out.data() + at, t.raw_data(), t.nbytes());
    at += t.nbytes();
  }
  return out;
}

SafetensorsFile decode_safetensors(std::span<const uint8_t> bytes, const std::string& name, const LoadOptions& options) {
  MemorySource src(bytes, name);
  return read_all(src, options);
}

void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, const Metadata& metadata,
                      const SaveOptions& options) {
  // Validate and build the header before touching the disk: a bad argument must not cost a temp file.
  std::string header = build_header(tensors, metadata, options.checksum, options.checksum ? payload_crc(tensors) : 0);
  AtomicFile f(path, options.write);
  uint8_t len[8];
  put_le64(len, header.size());
  f.write(len, 8);
  f.write(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    if (t.nbytes() > 0) f.write(t.raw_data(), t.nbytes());
  }
  f.commit();
}

SafetensorsFile load_safetensors(const std::filesystem::path& path, const LoadOptions& options) {
  FileSource src(path);
  return read_all(src, options);
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  FileSource src(path);
  return parse_header(src, /*verify_checksum=*/true);
}

}  // namespace demi::io
