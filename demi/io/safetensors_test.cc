// safetensors: round trips for every dtype, the layout other tools expect, every malformed input the
// reader must refuse (by file and tensor name), and checksums that catch any flipped bit.
#include "demi/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "demi/core/rng.h"
#include "demi/io/internal/test_util.h"

namespace demi::io {
namespace {

using test_util::expect_error;
using test_util::read_bytes;
using test_util::write_bytes;
using test_util::TempDir;

// A raw file: the 8-byte length, the header text as given, then `data`.
std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data = {}) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

// Random, never all-zero values of every dtype (bool: 0/1).
Tensor random_tensor(const Shape& shape, DType dt, Generator& gen) {
  Tensor t = empty(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = dt == DType::kBool ? static_cast<double>(gen.next_u32() & 1)
               : dt == DType::kU8 ? static_cast<double>(gen.next_u32() & 0xff)
               : is_floating(dt)  ? gen.next_normal() * 100
                                  : static_cast<double>(gen.next_int(2000000) - 1000000);
    t.set(i, v);
  }
  return t;
}

void expect_bit_identical(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  if (a.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  }
}

NamedTensors every_dtype(Generator& gen) {
  NamedTensors ts;
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                       DType::kI64, DType::kI32, DType::kU8,   DType::kBool};
  for (DType dt : all) ts.emplace_back(str_cat("t.", dtype_name(dt)), random_tensor({3, 5}, dt, gen));
  ts.emplace_back("scalar", random_tensor(Shape{}, DType::kF32, gen));
  ts.emplace_back("empty", empty({0, 4}, DType::kF16));
  ts.emplace_back("odd", random_tensor({7}, DType::kU8, gen));  // leaves later tensors unaligned
  return ts;
}

TEST(Safetensors, EveryDTypeRoundTripsThroughMemoryAndFile) {
  Generator gen(11);
  NamedTensors ts = every_dtype(gen);
  Metadata md{{"note", "hello \"world\"\n"}};
  std::vector<uint8_t> bytes = encode_safetensors(ts, md);

  TempDir dir;
  save_safetensors(dir / "a.safetensors", ts, md);
  EXPECT_EQ(read_bytes(dir / "a.safetensors"), bytes) << "save_safetensors and encode_safetensors must agree";

  for (const SafetensorsFile& f : {decode_safetensors(bytes, "mem"), load_safetensors(dir / "a.safetensors")}) {
    EXPECT_TRUE(f.checksum_verified);
    ASSERT_EQ(f.tensors.size(), ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
      SCOPED_TRACE(ts[i].first);
      EXPECT_EQ(f.tensors[i].first, ts[i].first) << "tensors come back in the order saved";
      expect_bit_identical(f.tensors[i].second, ts[i].second);
      EXPECT_EQ(f.tensors[i].second.name(), ts[i].first);
    }
    EXPECT_EQ(f.metadata.at("note"), "hello \"world\"\n");
    EXPECT_EQ(f.metadata.at("format"), "pt") << "Hugging Face's loaders require format=pt";
    EXPECT_EQ(f.metadata.at("demi.format_version"), "1");
    ASSERT_NE(f.find("t.bfloat16"), nullptr);
    EXPECT_EQ(f.find("nope"), nullptr);
  }
}

TEST(Safetensors, LayoutIsWhatOtherReadersExpect) {
  Tensor a = from_vector<float>({1.5f, -2.0f}, {2});
  std::vector<uint8_t> bytes = encode_safetensors({{"a", a}}, {}, /*checksum=*/false);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
  EXPECT_EQ((8 + n) % 8, 0u) << "data starts 8-byte aligned";
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"demi.format_version\":\"1\",\"format\":\"pt\"},"
                         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                         0),
            0u)
      << header;
  ASSERT_EQ(bytes.size(), 8 + n + 8);
  float back[2];
  std::memcpy(back, bytes.data() + 8 + n, 8);  // little-endian, row-major
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[1], -2.0f);
}

TEST(Safetensors, ReadsFilesOtherToolsWrite) {
  // As PyTorch/Hugging Face write it: tensors in any header order, whitespace, no demi metadata.
  std::vector<uint8_t> data(12 + 4);
  float w[3] = {1, 2, 3};
  int32_t b = -7;
  std::memcpy(data.data(), &b, 4);
  std::memcpy(data.data() + 4, w, 12);
  auto f = decode_safetensors(raw_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]},
      "__metadata__": {"format": "pt"}, "b": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]}}   )",
                                       data),
                              "hf.safetensors");
  EXPECT_FALSE(f.checksum_verified);
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "b") << "ordered by data offset";
  EXPECT_EQ(f.tensors[0].second.item(), -7);
  EXPECT_EQ(f.tensors[1].second.to_vector(), (std::vector<float>{1, 2, 3}));
  // An empty file of tensors is valid too.
  EXPECT_TRUE(decode_safetensors(raw_file("{}"), "e").tensors.empty());
}

struct Malformed {
  const char* what;
  std::vector<uint8_t> bytes;
  std::vector<std::string> pieces;
};

std::vector<Malformed> malformed_cases() {
  auto entry = [](const std::string& name, const std::string& body) { return "\"" + name + "\":{" + body + "}"; };
  std::vector<uint8_t> d8(8, 1), d16(16, 1);
  std::vector<Malformed> c;
  c.push_back({"too short", {1, 2, 3}, {"bad.st", "fewer than the 8-byte header length"}});
  c.push_back({"absurd header length", {0, 0, 0, 0, 0, 0, 0, 0x40, '{', '}'}, {"bad.st", "is absurd"}});
  c.push_back({"header longer than file", {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'}, {"bad.st", "exceeds the file"}});
  c.push_back({"zero header length", {0, 0, 0, 0, 0, 0, 0, 0}, {"bad.st", "too short to hold"}});
  c.push_back({"invalid JSON", raw_file("{\"a\":"), {"bad.st: header: invalid JSON at byte 5"}});
  c.push_back({"not an object", raw_file("[1]"), {"bad.st", "must be a JSON object"}});
  c.push_back({"duplicate names", raw_file("{" + entry("w", R"("dtype":"U8","shape":[8],"data_offsets":[0,8])") + "," +
                                           entry("w", R"("dtype":"U8","shape":[8],"data_offsets":[8,16])") + "}", d16),
               {"bad.st", "duplicate key \"w\""}});
  c.push_back({"unknown dtype", raw_file("{" + entry("w", R"("dtype":"F17","shape":[8],"data_offsets":[0,8])") + "}", d8),
               {"bad.st: tensor 'w'", "unknown dtype \"F17\"", "F32, F16, BF16"}});
  c.push_back({"unsupported dtype", raw_file("{" + entry("w", R"("dtype":"I16","shape":[4],"data_offsets":[0,8])") + "}", d8),
               {"tensor 'w'", "\"I16\" is not one demi supports"}});
  c.push_back({"size mismatch", raw_file("{" + entry("w", R"("dtype":"F32","shape":[3],"data_offsets":[0,8])") + "}", d8),
               {"bad.st: tensor 'w'", "shape (3) of F32 needs 12 bytes", "hold 8"}});
  c.push_back({"out of bounds", raw_file("{" + entry("w", R"("dtype":"U8","shape":[16],"data_offsets":[0,16])") + "}", d8),
               {"tensor 'w'", "out of bounds", "holds 8 bytes"}});
  c.push_back({"end before begin", raw_file("{" + entry("w", R"("dtype":"U8","shape":[0],"data_offsets":[8,0])") + "}", d8),
               {"tensor 'w'", "end before they begin"}});
  c.push_back({"overlap", raw_file("{" + entry("a", R"("dtype":"U8","shape":[8],"data_offsets":[0,8])") + "," +
                                   entry("b", R"("dtype":"U8","shape":[4],"data_offsets":[4,8])") + "}", d8),
               {"tensor 'b'", "overlap tensor 'a'"}});
  c.push_back({"gap", raw_file("{" + entry("a", R"("dtype":"U8","shape":[4],"data_offsets":[4,8])") + "}", d8),
               {"tensor 'a'", "gap of 4 bytes after the header"}});
  c.push_back({"trailing bytes", raw_file("{" + entry("a", R"("dtype":"U8","shape":[4],"data_offsets":[0,4])") + "}", d8),
               {"bad.st", "cover only 4", "after tensor 'a'"}});
  c.push_back({"shape overflow", raw_file("{" + entry("w", R"("dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0])") + "}"),
               {"tensor 'w'", "overflows"}});
  c.push_back({"overflow beside a zero dim",
               raw_file("{" + entry("w", R"("dtype":"F64","shape":[0,4294967296,4294967296],"data_offsets":[0,0])") + "}"),
               {"tensor 'w'", "overflows"}});
  c.push_back({"negative dim", raw_file("{" + entry("w", R"("dtype":"U8","shape":[-8],"data_offsets":[0,8])") + "}", d8),
               {"tensor 'w'", "must not be negative"}});
  c.push_back({"rank 9", raw_file("{" + entry("w", R"("dtype":"U8","shape":[1,1,1,1,1,1,1,1,8],"data_offsets":[0,8])") + "}", d8),
               {"tensor 'w'", "9 dimensions"}});
  c.push_back({"float dim", raw_file("{" + entry("w", R"("dtype":"U8","shape":[8.0],"data_offsets":[0,8])") + "}", d8),
               {"bad.st: header: invalid JSON", "only integers"}});
  c.push_back({"missing dtype", raw_file("{" + entry("w", R"("shape":[8],"data_offsets":[0,8])") + "}", d8),
               {"tensor 'w'", "no \"dtype\""}});
  c.push_back({"missing offsets", raw_file("{" + entry("w", R"("dtype":"U8","shape":[8])") + "}", d8),
               {"tensor 'w'", "no \"data_offsets\""}});
  c.push_back({"three offsets", raw_file("{" + entry("w", R"("dtype":"U8","shape":[8],"data_offsets":[0,8,8])") + "}", d8),
               {"tensor 'w'", "two integers"}});
  c.push_back({"extra key", raw_file("{" + entry("w", R"("dtype":"U8","shape":[8],"data_offsets":[0,8],"x":1)") + "}", d8),
               {"tensor 'w'", "unexpected key \"x\""}});
  c.push_back({"entry not an object", raw_file(R"({"w":[1]})"), {"tensor 'w'", "expected an object"}});
  c.push_back({"empty name", raw_file("{" + entry("", R"("dtype":"U8","shape":[8],"data_offsets":[0,8])") + "}", d8),
               {"bad.st", "empty name"}});
  c.push_back({"metadata not strings", raw_file(R"({"__metadata__":{"a":1}})"), {"bad.st", "\"a\" must be a string"}});
  c.push_back({"bool byte", raw_file("{" + entry("m", R"("dtype":"BOOL","shape":[8],"data_offsets":[0,8])") + "}", std::vector<uint8_t>{0, 1, 2, 0, 0, 0, 0, 0}),
               {"tensor 'm'", "element 2 holds byte 2"}});
  c.push_back({"newer format", raw_file(R"({"__metadata__":{"demi.format_version":"2"}})"),
               {"bad.st", "newer demi: format version 2"}});
  c.push_back({"bad format version", raw_file(R"({"__metadata__":{"demi.format_version":"x"}})"),
               {"bad.st", "not a positive integer"}});
  return c;
}

TEST(Safetensors, EveryMalformedInputIsAnErrorNamingFileAndTensor) {
  TempDir dir;
  for (const Malformed& m : malformed_cases()) {
    SCOPED_TRACE(m.what);
    std::string msg;
    try {
      decode_safetensors(m.bytes, "bad.st");
      ADD_FAILURE() << "accepted";
    } catch (const InternalError& e) {
      ADD_FAILURE() << "internal error: " << e.what();
    } catch (const Error& e) {
      msg = e.what();
    }
    for (const auto& p : m.pieces) EXPECT_NE(msg.find(p), std::string::npos) << "missing \"" << p << "\" in: " << msg;
    // The file reader runs the same checks.
    write_bytes(dir / "bad.st", m.bytes);
    EXPECT_THROW(load_safetensors(dir / "bad.st"), Error);
  }
}

TEST(Safetensors, EveryFlippedBitOfADemiFileIsDetected) {
  Generator gen(3);
  NamedTensors ts = {{"w", random_tensor({4, 3}, DType::kF32, gen)}, {"b", random_tensor({4}, DType::kBF16, gen)},
                     {"steps", random_tensor({2}, DType::kI64, gen)}};
  const std::vector<uint8_t> good = encode_safetensors(ts, {{"epoch", "3"}});
  int undetected = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = good;
      bad[i] ^= static_cast<uint8_t>(1u << bit);
      try {
        decode_safetensors(bad, "flip.st");
        ++undetected;
        ADD_FAILURE() << "a flip of bit " << bit << " of byte " << i << " went unnoticed";
      } catch (const InternalError& e) {
        ADD_FAILURE() << e.what();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("flip.st"), std::string::npos) << e.what();
      }
      if (undetected > 3) return;
    }
  }
}

TEST(Safetensors, ChecksumMismatchNamesTheFileAndCanBeSkipped) {
  Generator gen(5);
  NamedTensors ts = {{"w", random_tensor({64}, DType::kF32, gen)}};
  std::vector<uint8_t> bytes = encode_safetensors(ts);
  bytes[bytes.size() - 3] ^= 0x10;  // in the data section
  expect_error([&] { decode_safetensors(bytes, "ckpt.safetensors"); },
               {"ckpt.safetensors: data checksum mismatch", "the file is corrupt"});
  auto f = decode_safetensors(bytes, "ckpt.safetensors", {.verify_checksum = false});
  EXPECT_FALSE(f.checksum_verified);

  // A header byte flipped into another valid header (F32 -> I32: same size) fails the header CRC.
  std::vector<uint8_t> h = encode_safetensors(ts);
  std::string text(h.begin(), h.end());
  size_t at = text.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  h[at + 1] = 'I';
  expect_error([&] { decode_safetensors(h, "ckpt.safetensors"); }, {"ckpt.safetensors: header checksum mismatch"});

  // Without checksums (checksum=false) nothing is stored and nothing is verified.
  auto plain = encode_safetensors(ts, {}, false);
  EXPECT_EQ(std::string(plain.begin(), plain.end()).find("crc32"), std::string::npos);
}

TEST(Safetensors, WriterRefusesBadArguments) {
  Tensor t = zeros({2});
  expect_error([&] { encode_safetensors({{"a", t}, {"a", t}}); }, {"two tensors are named 'a'"});
  expect_error([&] { encode_safetensors({{"", t}}); }, {"empty name"});
  expect_error([&] { encode_safetensors({{"__metadata__", t}}); }, {"reserved"});
  expect_error([&] { encode_safetensors({{"u", Tensor()}}); }, {"tensor 'u' is undefined"});
  // A caller's checksum keys are replaced by fresh ones (re-saving a loaded file's metadata works).
  auto bytes = encode_safetensors({{"a", t}}, {{"demi.payload_crc32", "00000000"}});
  EXPECT_NO_THROW(decode_safetensors(bytes, "m"));
}

TEST(Safetensors, HeaderOnlyRead) {
  TempDir dir;
  save_safetensors(dir / "h.safetensors", {{"x", zeros({2, 3}, DType::kBF16)}, {"y", zeros({5}, DType::kI64)}});
  SafetensorsHeader h = read_safetensors_header(dir / "h.safetensors");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "x");
  EXPECT_EQ(h.tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(h.tensors[0].shape, Shape({2, 3}));
  EXPECT_EQ(h.tensors[1].begin, 12u);
  EXPECT_EQ(h.data_size, 52u);
  EXPECT_EQ(h.data_offset % 8, 0u);
  expect_error([&] { read_safetensors_header(dir / "missing.safetensors"); },
               {"missing.safetensors", "No such file or directory"});
  expect_error([&] { load_safetensors(dir.path()); }, {"is a directory"});
}

}  // namespace
}  // namespace demi::io
