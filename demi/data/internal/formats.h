// The on-disk formats the readers understand, decoded from bytes already in memory so that the same
// code serves the datasets and the fuzz targets: IDX (MNIST, Fashion-MNIST; plain or gzip-compressed)
// and the CIFAR-10 binary format. Every check that guards an allocation or a copy is done here, against
// the real size of the input, with overflow-checked arithmetic: a malformed file is a demi::Error that
// names the file and the problem, never a crash, a huge allocation or a silently short dataset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "demi/core/tensor.h"

namespace demi::data::internal {

// The whole file, or a demi::Error naming the path and the system's reason.
std::vector<uint8_t> read_file(const std::filesystem::path& path);

// "a, b, c (and 12 more)": a directory's entries, for errors about files that were not found there.
std::string list_directory(const std::filesystem::path& dir, size_t max_entries = 12);

// True when `bytes` start with the gzip magic (1f 8b); detection is by content, not by file name.
bool is_gzip(std::span<const uint8_t> bytes);

// The most bytes deflate can expand `compressed` bytes into (its best ratio is 1032:1), so that a header
// claiming more than a gzip file can possibly hold is refused before anything is allocated.
uint64_t max_inflated_size(uint64_t compressed);

// Pull-style gunzip over a buffer in memory (one or more concatenated gzip members). read() fills the
// destination and returns how many bytes it produced, fewer only at the end of the stream. A truncated
// or corrupt stream (including a bad CRC, checked by zlib at the end of each member) and bytes after
// the last member that are not another gzip member are demi::Errors naming `name`.
class GzipReader {
 public:
  GzipReader(std::span<const uint8_t> compressed, std::string name);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  size_t read(uint8_t* dst, size_t n);
  // Reads on to the end of the stream (verifying its checksum); true when no more data was there.
  bool at_end();
  uint64_t produced() const { return produced_; }

 private:
  struct State;
  State* s_;
  std::string name_;
  uint64_t produced_ = 0;
  bool ended_ = false;
};

// An IDX array of unsigned bytes (type code 0x08) with `rank` dimensions: magic 0x0000 08 <rank>, then
// `rank` big-endian uint32 dimensions, then the data. Every dimension must be at least 1. A plain file
// must hold exactly the data its header describes; a gzip file's header is checked against the most its
// size can inflate to, and its buffer grows only as decompressed data arrives, so no header can make the
// decoder allocate much more than the data really there.
struct IdxArray {
  std::vector<int64_t> dims;
  Tensor data;  // uint8, shape `dims`, tagged MemCategory::kData
};
IdxArray decode_idx_u8(std::span<const uint8_t> file, int rank, const std::string& name);

// The CIFAR-10 binary format: records of one label byte (0..9) and 3072 pixel bytes (the red, green
// and blue 32x32 planes, so CHW already).
inline constexpr int64_t kCifarRecordBytes = 3073;
inline constexpr int64_t kCifarImageBytes = 3072;
inline constexpr int kCifarClasses = 10;
// The number of records in a file of this content, or a demi::Error (empty, or not whole records).
int64_t cifar10_record_count(std::span<const uint8_t> file, const std::string& name);
// Decodes cifar10_record_count(file) records into images (3072 bytes each) and labels; a label above 9
// is a demi::Error naming the record.
void decode_cifar10(std::span<const uint8_t> file, const std::string& name, uint8_t* images,
                    int32_t* labels);

}  // namespace demi::data::internal
