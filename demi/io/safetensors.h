// The safetensors format (Hugging Face's), read and written by hand so that PyTorch and Hugging Face
// tools read demi's checkpoints and demi reads theirs:
//
//   [8 bytes: N, little-endian u64][N bytes: JSON header][data section]
//   header = {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"<key>": "<string value>", ...}}
//
// Offsets are relative to the data section; the tensors' byte ranges cover it exactly, without gaps or
// overlaps. Data is little-endian and row-major. dtypes: F32, F16, BF16, F64, I64, I32, U8, BOOL.
//
// demi adds to __metadata__ (other readers ignore it): "format": "pt" (what Hugging Face's loaders look
// for), "demi.format_version", and two CRC-32s (zlib's polynomial, 8 lowercase hex digits):
//   demi.payload_crc32 — of the whole data section;
//   demi.header_crc32  — of the header's meaning, so that a flipped byte in a shape, a dtype or a metadata
//                        value is caught too: the bytes, for each tensor sorted by name,
//                          name \0 dtype \0 dims joined by "," \0 begin \0 end \n
//                        then for each metadata entry sorted by key, except demi.header_crc32 itself,
//                          key \0 value \n
// Both are verified on load when present (a file from another tool has none and is read unchecked).
//
// The reader trusts nothing in the file: every malformed input — a short file, an absurd header length,
// invalid JSON, an unknown dtype, a shape whose size overflows or disagrees with its byte range, ranges
// out of bounds, overlapping or leaving gaps, duplicate names, a bool byte other than 0 or 1, a checksum
// mismatch — is a demi::Error naming the file and, where there is one, the tensor. Nothing is allocated
// beyond what the file really holds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "demi/core/tensor.h"
#include "demi/io/atomic_file.h"

namespace demi::io {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// The format version demi writes in "demi.format_version" and the newest it reads.
inline constexpr int kSafetensorsFormatVersion = 1;
// Hugging Face's own limit on the header length; anything larger is refused before it is read.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Metadata keys the writer owns: recomputed on every save (a caller's values for them are replaced).
inline constexpr std::string_view kFormatVersionKey = "demi.format_version";
inline constexpr std::string_view kPayloadCrcKey = "demi.payload_crc32";
inline constexpr std::string_view kHeaderCrcKey = "demi.header_crc32";

// "F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL".
std::string_view safetensors_dtype_code(DType t);
// The dtype of a code, or nullopt for a code demi does not read.
std::optional<DType> parse_safetensors_dtype(std::string_view code);

struct SaveOptions {
  bool checksum = true;  // store demi.payload_crc32 and demi.header_crc32
  AtomicWriteOptions write;
};

struct LoadOptions {
  bool verify_checksum = true;  // verify the CRCs when the file has them
  MemCategory category = MemCategory::kOther;  // what the loaded tensors' memory is counted as
};

// One tensor's entry in the header.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in the order of their data in the file
  Metadata metadata;                // __metadata__, demi's keys included
  uint64_t data_offset = 0;         // where the data section starts in the file (8 + N)
  uint64_t data_size = 0;
};

struct SafetensorsFile {
  NamedTensors tensors;  // in the order of their data in the file (for demi's files: the order saved)
  Metadata metadata;
  bool checksum_verified = false;  // the file had demi's CRCs and they matched

  // The tensor named `name`, or nullptr.
  const Tensor* find(std::string_view name) const;
};

// The file's bytes. Names must be unique and non-empty, and "__metadata__" is reserved.
std::vector<uint8_t> encode_safetensors(const NamedTensors& tensors, const Metadata& metadata = {},
                                        bool checksum = true);
// Decodes a whole file held in memory; `name` is what errors call it (a path, or "<memory>").
SafetensorsFile decode_safetensors(std::span<const uint8_t> bytes, const std::string& name,
                                   const LoadOptions& options = {});

// Writes atomically (atomic_file.h), streaming the tensors' bytes (no second copy in memory).
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, const Metadata& metadata = {},
                      const SaveOptions& options = {});
// Reads the header, validates all of it, then reads each tensor straight into its own storage.
SafetensorsFile load_safetensors(const std::filesystem::path& path, const LoadOptions& options = {});
// The header only (validated as load_safetensors does, without reading or checking the data).
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);

}  // namespace demi::io
