// Decoders for IDX (plain or gzip) and CIFAR-10 binary files held in memory; see formats.h. The checks
// come before any allocation sized by the file's header, and every size the header claims is compared
// with what the file can really hold.
#include "demi/data/internal/formats.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>

#include "demi/core/error.h"
#include "demi/data/internal/util.h"

namespace demi::data::internal {
namespace {

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

}  // namespace

std::vector<uint8_t> read_file(const std::filesystem::path& path) {
  std::error_code ec;
  auto st = std::filesystem::status(path, ec);
  DEMI_CHECK(!ec && std::filesystem::exists(st), path.string(), ": file not found");
  DEMI_CHECK(!std::filesystem::is_directory(st), path.string(), ": is a directory, expected a file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  DEMI_CHECK(f != nullptr, path.string(), ": cannot open (", std::strerror(errno), ")");
  uintmax_t size = std::filesystem::file_size(path, ec);
  DEMI_CHECK(!ec, path.string(), ": cannot read its size (", ec.message(), ")");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f.get());
  DEMI_CHECK(got == bytes.size(), path.string(), ": read error after ", got, " of ", bytes.size(),
             " bytes (", std::ferror(f.get()) ? std::strerror(errno) : "the file shrank while being read",
             ")");
  return bytes;
}

std::string list_directory(const std::filesystem::path& dir, size_t max_entries) {
  std::error_code ec;
  std::vector<std::string> names;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return str_cat("(cannot list it: ", ec.message(), ")");
  if (names.empty()) return "nothing (the directory is empty)";
  std::sort(names.begin(), names.end());
  std::string s;
  for (size_t i = 0; i < names.size() && i < max_entries; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > max_entries) s += str_cat(" (and ", names.size() - max_entries, " more)");
  return s;
}

bool is_gzip(std::span<const uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

uint64_t max_inflated_size(uint64_t compressed) {
  // zlib's technical notes: deflate's maximum compression is 1032:1 (258-byte matches coded in 2 bits).
  constexpr uint64_t kMaxRatio = 1032;
  auto m = checked_mul(compressed, kMaxRatio);
  return m ? *m + 1024 : UINT64_MAX;
}

// ---- GzipReader ----

struct GzipReader::State {
  z_stream zs{};
  std::span<const uint8_t> in;
  size_t in_pos = 0;  // input bytes handed to zlib so far (zlib takes at most 4 GiB per call)

  void feed() {
    if (zs.avail_in == 0 && in_pos < in.size()) {
      size_t n = std::min<size_t>(in.size() - in_pos, UINT_MAX);
      zs.next_in = const_cast<Bytef*>(in.data() + in_pos);  // zlib's API is not const-correct
      zs.avail_in = static_cast<uInt>(n);
      in_pos += n;
    }
  }
  uint64_t remaining() const { return zs.avail_in + (in.size() - in_pos); }
};

GzipReader::GzipReader(std::span<const uint8_t> compressed, std::string name)
    : s_(new State), name_(std::move(name)) {
  s_->in = compressed;
  // 16 + MAX_WBITS: expect the gzip wrapper (header, CRC-32 and length trailer), not raw zlib.
  int rc = inflateInit2(&s_->zs, 16 + MAX_WBITS);
  if (rc != Z_OK) {
    delete s_;
    s_ = nullptr;
    DEMI_CHECK(false, name_, ": zlib could not start decompressing (", zError(rc), ")");
  }
}

GzipReader::~GzipReader() {
  if (s_) inflateEnd(&s_->zs);
  delete s_;
}

size_t GzipReader::read(uint8_t* dst, size_t n) {
  z_stream& zs = s_->zs;
  size_t done = 0;
  while (done < n && !ended_) {
    s_->feed();
    size_t want = std::min<size_t>(n - done, UINT_MAX);
    zs.next_out = dst + done;
    zs.avail_out = static_cast<uInt>(want);
    int rc = inflate(&zs, Z_NO_FLUSH);
    size_t got = want - zs.avail_out;
    done += got;
    produced_ += got;
    if (rc == Z_STREAM_END) {
      s_->feed();
      if (s_->remaining() == 0) {
        ended_ = true;
        break;
      }
      // gzip allows concatenated members (what `cat a.gz b.gz` makes); anything else is garbage.
      DEMI_CHECK(zs.avail_in >= 2 && zs.next_in[0] == 0x1f && zs.next_in[1] == 0x8b, name_, ": ",
                 s_->remaining(), " bytes of trailing data after the end of the gzip stream");
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && s_->remaining() == 0) {
      DEMI_CHECK(false, name_, ": the gzip stream is truncated (the compressed input ends after ", produced_,
                 " decompressed bytes, before the end of the stream)");
    }
    DEMI_CHECK(false, name_, ": corrupt gzip stream after ", produced_, " decompressed bytes (zlib: ",
               zs.msg ? zs.msg : zError(rc), ")");
  }
  return done;
}

bool GzipReader::at_end() {
  uint8_t scratch;
  return read(&scratch, 1) == 0;
}

// ---- IDX ----

IdxArray decode_idx_u8(std::span<const uint8_t> file, int rank, const std::string& name) {
  DEMI_ASSERT(rank >= 1 && rank <= Shape::kMaxRank);
  const uint32_t expected_magic = 0x00000800u | static_cast<uint32_t>(rank);
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(rank);
  DEMI_CHECK(!file.empty(), name, ": the file is empty (expected an IDX file, magic ", hex32(expected_magic),
             ")");
  const bool gz = is_gzip(file);
  std::unique_ptr<GzipReader> gzr;
  if (gz) gzr = std::make_unique<GzipReader>(file, name);

  // The header: from the file, or from the start of the decompressed stream.
  std::vector<uint8_t> header(header_bytes);
  size_t have;
  if (gz) {
    have = gzr->read(header.data(), 4);
  } else {
    have = std::min<size_t>(4, file.size());
    std::memcpy(header.data(), file.data(), have);
  }
  DEMI_CHECK(have == 4, name, ": truncated: ", gz ? "the decompressed data" : "the file", " ends after ", have,
             " bytes, inside the IDX magic number (expected ", hex32(expected_magic), ")");
  uint32_t magic = load_be32(header.data());
  if (magic != expected_magic) {
    std::string hint;
    if ((magic & 0xFFFFFF00u) == 0x00000800u) {
      hint = str_cat("; it is an IDX file of unsigned bytes with ", magic & 0xFFu, " dimensions where ", rank,
                     " were expected (", rank == 3 ? "a labels file given as images?" : "an images file given as labels?",
                     ")");
    } else if (gz) {
      hint = "; the gzip stream decompressed fine, but its content is not an IDX file";
    } else {
      hint = "; not an IDX file (nor gzip-compressed)";
    }
    DEMI_CHECK(false, name, ": wrong magic number ", hex32(magic), " (expected ", hex32(expected_magic),
               ", an IDX file of unsigned bytes with ", rank, " dimensions)", hint);
  }
  size_t dim_bytes = header_bytes - 4;
  if (gz) {
    have = gzr->read(header.data() + 4, dim_bytes);
  } else {
    have = std::min<size_t>(dim_bytes, file.size() - 4);
    std::memcpy(header.data() + 4, file.data() + 4, have);
  }
  DEMI_CHECK(have == dim_bytes, name, ": truncated: the IDX header ends after ", 4 + have, " of ", header_bytes,
             " bytes");

  IdxArray out;
  uint64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    uint32_t d = load_be32(header.data() + 4 + 4 * static_cast<size_t>(i));
    out.dims.push_back(d);
    auto t = checked_mul(total, d);
    DEMI_CHECK(t.has_value(), name, ": absurd IDX header: dimensions ", dims_string(out.dims),
               "... overflow 64 bits");
    total = *t;
  }
  DEMI_CHECK(total > 0, name, ": IDX header dimensions ", dims_string(out.dims),
             " hold no data (every dimension must be at least 1)");

  if (gz) {
    uint64_t most = max_inflated_size(file.size());
    DEMI_CHECK(total <= most, name, ": absurd IDX header: dimensions ", dims_string(out.dims), " claim ", total,
               " data bytes, more than a gzip file of ", file.size(), " bytes can hold (at most ", most, ")");
  } else {
    uint64_t avail = file.size() - header_bytes;
    DEMI_CHECK(total <= avail, name, ": truncated: the header's dimensions ", dims_string(out.dims), " need ",
               total, " data bytes but only ", avail, " follow the header");
    DEMI_CHECK(total == avail, name, ": ", avail - total, " unexpected bytes after the ", total,
               " data bytes that the header's dimensions ", dims_string(out.dims), " describe");
  }

  const Shape shape(std::span<const int64_t>(out.dims));
  if (!gz) {
    out.data = empty(shape, DType::kU8, MemCategory::kData);
    std::memcpy(out.data.raw_data(), file.data() + header_bytes, static_cast<size_t>(total));
    return out;
  }
  // A gzip header's claim is believed only as far as the data bears it out: the buffer starts at what
  // the file plausibly holds (real images compress 2-5x) and doubles as data arrives, so a lying header
  // costs at most twice the real data, never the claimed size.
  uint64_t cap = std::min<uint64_t>(total, 8 * static_cast<uint64_t>(file.size()) + (1u << 20));
  Tensor buf = empty({static_cast<int64_t>(cap)}, DType::kU8, MemCategory::kData);
  uint64_t filled = 0;
  for (;;) {
    filled += gzr->read(buf.data<uint8_t>() + filled, static_cast<size_t>(cap - filled));
    DEMI_CHECK(filled == cap, name, ": truncated: the decompressed data ends after ", filled, " of the ", total,
               " data bytes that the header's dimensions ", dims_string(out.dims), " describe");
    if (cap == total) break;
    uint64_t grown = std::min<uint64_t>(total, 2 * cap);
    Tensor bigger = empty({static_cast<int64_t>(grown)}, DType::kU8, MemCategory::kData);
    std::memcpy(bigger.raw_data(), buf.raw_data(), static_cast<size_t>(filled));
    buf = std::move(bigger);
    cap = grown;
  }
  DEMI_CHECK(gzr->at_end(), name, ": the decompressed data is longer than the ", total,
             " bytes that the header's dimensions ", dims_string(out.dims), " describe");
  out.data = buf.reshape(shape);
  return out;
}

// ---- CIFAR-10 ----

int64_t cifar10_record_count(std::span<const uint8_t> file, const std::string& name) {
  DEMI_CHECK(!file.empty(), name, ": the file is empty (expected CIFAR-10 binary records of ",
             kCifarRecordBytes, " bytes)");
  int64_t size = static_cast<int64_t>(file.size());
  DEMI_CHECK(size % kCifarRecordBytes == 0, name, ": truncated or not a CIFAR-10 binary file: ", size,
             " bytes is not a whole number of ", kCifarRecordBytes, "-byte records (", size / kCifarRecordBytes,
             " records and ", size % kCifarRecordBytes, " bytes left over)");
  return size / kCifarRecordBytes;
}

void decode_cifar10(std::span<const uint8_t> file, const std::string& name, uint8_t* images,
                    int32_t* labels) {
  int64_t n = cifar10_record_count(file, name);
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* rec = file.data() + r * kCifarRecordBytes;
    DEMI_CHECK(rec[0] < kCifarClasses, name, ": record ", r, " (byte offset ", r * kCifarRecordBytes,
               ") has label ", int{rec[0]}, "; CIFAR-10 labels are 0..", kCifarClasses - 1,
               " (is this a CIFAR-100 file, which has two label bytes per record?)");
    labels[r] = rec[0];
    std::memcpy(images + r * kCifarImageBytes, rec + 1, kCifarImageBytes);
  }
}

}  // namespace demi::data::internal
