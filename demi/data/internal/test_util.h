// Helpers for the data module's tests (header-only, used by *_test.cc only): a temporary directory
// removed on scope exit, file writers (plain and gzip), IDX file builders, and a check that a callable
// throws a demi::Error whose message mentions given pieces.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "demi/core/test_support.h"
#include "demi/data/dataset.h"
#include "demi/data/iterator.h"

namespace demi::data::test_util {

using test_support::error_message;
using test_support::expect_error;
using test_support::TempDir;
using test_support::write_bytes;

inline std::vector<uint8_t> gzip(const std::vector<uint8_t>& data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, static_cast<uLong>(data.size())) + 64);
  zs.next_in = const_cast<Bytef*>(data.data());
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

inline void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

// An IDX file of unsigned bytes: magic 0x000008<rank>, the dimensions, then `data`.
inline std::vector<uint8_t> idx_file(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                                     uint32_t magic = 0) {
  std::vector<uint8_t> v;
  put_be32(v, magic ? magic : 0x00000800u | static_cast<uint32_t>(dims.size()));
  for (uint32_t d : dims) put_be32(v, d);
  v.insert(v.end(), data.begin(), data.end());
  return v;
}

// Every row of one epoch.
inline std::vector<Row> collect(const std::shared_ptr<Dataset>& ds, int64_t epoch = 0) {
  auto it = ds->create_iterator({.epoch = epoch});
  std::vector<Row> rows;
  while (auto r = it->next()) rows.push_back(std::move(*r));
  return rows;
}

// Column `c` of every row as one value each (rows must hold one-element tensors there).
inline std::vector<int64_t> column_values(const std::vector<Row>& rows, size_t c = 0) {
  std::vector<int64_t> v;
  for (const auto& r : rows) v.push_back(static_cast<int64_t>(r[c].item()));
  return v;
}

// Every element of a column across rows, flattened (for comparing whole epochs).
inline std::vector<float> flat_values(const std::vector<Row>& rows, size_t c) {
  std::vector<float> v;
  for (const auto& r : rows) {
    auto x = r[c].to_vector();
    v.insert(v.end(), x.begin(), x.end());
  }
  return v;
}

}  // namespace demi::data::test_util
