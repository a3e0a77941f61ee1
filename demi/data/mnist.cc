// MnistDataset: finds the split's IDX files, decodes them (internal/formats.cc) and checks that images
// and labels agree in count and labels in range, once, when the dataset is created.
#include "demi/data/mnist.h"

#include <cstring>
#include <filesystem>

#include "demi/core/error.h"
#include "demi/data/internal/formats.h"
#include "demi/data/internal/util.h"

namespace demi::data {
namespace fs = std::filesystem;
namespace {

// The first of the accepted names of one file that exists in `dir`, or an error listing them all and
// what the directory holds instead.
fs::path find_idx_file(const fs::path& dir, const std::string& prefix, const std::string& kind, int rank) {
  const std::string idx = "idx" + std::to_string(rank) + "-ubyte";
  std::vector<std::string> names;
  for (const std::string& base : {prefix + "-" + kind + "-" + idx, prefix + "-" + kind + "." + idx}) {
    names.push_back(base);
    names.push_back(base + ".gz");
  }
  std::error_code ec;
  for (const auto& n : names) {
    if (fs::is_regular_file(dir / n, ec)) return dir / n;
  }
  DEMI_CHECK(false, "MnistDataset: no ", prefix, " ", kind, " file in '", dir.string(), "': expected ",
             internal::join_names(names), "; the directory holds ", internal::list_directory(dir));
  return {};
}

}  // namespace

MnistDataset::MnistDataset(const std::string& dataset_dir, const std::string& usage, MnistOptions options)
    : Dataset({"image", "label"}), dir_(dataset_dir), usage_(usage) {
  DEMI_CHECK(usage == "train" || usage == "test" || usage == "all",
             "MnistDataset: usage must be \"train\", \"test\" or \"all\", got \"", usage, "\"");
  DEMI_CHECK(options.num_classes >= 1, "MnistDataset: num_classes must be >= 1, got ", options.num_classes);
  std::error_code ec;
  DEMI_CHECK(fs::exists(dataset_dir, ec), "MnistDataset: dataset directory '", dataset_dir, "' does not exist");
  DEMI_CHECK(fs::is_directory(dataset_dir, ec), "MnistDataset: '", dataset_dir, "' is not a directory");

  std::vector<std::string> prefixes;
  if (usage != "test") prefixes.push_back("train");
  if (usage != "train") prefixes.push_back("t10k");
  std::vector<internal::IdxArray> images, labels;
  for (const auto& prefix : prefixes) {
    fs::path img_path = find_idx_file(dataset_dir, prefix, "images", 3);
    fs::path lab_path = find_idx_file(dataset_dir, prefix, "labels", 1);
    files_.push_back(img_path.string());
    files_.push_back(lab_path.string());
    auto img = internal::decode_idx_u8(internal::read_file(img_path), 3, img_path.string());
    auto lab = internal::decode_idx_u8(internal::read_file(lab_path), 1, lab_path.string());
    DEMI_CHECK(img.dims[0] == lab.dims[0], "MnistDataset: ", img_path.string(), " has ", img.dims[0],
               " images but ", lab_path.string(), " has ", lab.dims[0], " labels");
    const uint8_t* l = lab.data.data<uint8_t>();
    for (int64_t i = 0; i < lab.dims[0]; ++i) {
      DEMI_CHECK(l[i] < options.num_classes, lab_path.string(), ": label ", int{l[i]}, " at index ", i,
                 " is outside [0, ", options.num_classes, ") (MnistOptions::num_classes)");
    }
    if (!images.empty()) {
      DEMI_CHECK(img.dims[1] == images[0].dims[1] && img.dims[2] == images[0].dims[2], "MnistDataset: ",
                 img_path.string(), " holds ", img.dims[1], "x", img.dims[2], " images but ", files_[0], " holds ",
                 images[0].dims[1], "x", images[0].dims[2]);
    }
    images.push_back(std::move(img));
    labels.push_back(std::move(lab));
  }

  const int64_t rows = images[0].dims[1], cols = images[0].dims[2];
  int64_t total = 0;
  for (const auto& a : images) total += a.dims[0];
  image_shape_ = Shape{1, rows, cols};
  if (images.size() == 1) {
    images_ = images[0].data.reshape({total, 1, rows, cols});  // a view: no copy
  } else {
    images_ = empty({total, 1, rows, cols}, DType::kU8, MemCategory::kData);
    auto* dst = images_.data<uint8_t>();
    for (const auto& a : images) {
      std::memcpy(dst, a.data.raw_data(), a.data.nbytes());
      dst += a.data.nbytes();
    }
  }
  labels_ = empty({total}, DType::kI32, MemCategory::kData);
  int32_t* out = labels_.data<int32_t>();
  for (const auto& a : labels) {
    const uint8_t* l = a.data.data<uint8_t>();
    for (int64_t i = 0; i < a.dims[0]; ++i) *out++ = l[i];
  }
}

std::string MnistDataset::describe() const { return str_cat("MnistDataset(", dir_, ", ", usage_, ")"); }

Row MnistDataset::get_row(int64_t index, int64_t) const {
  DEMI_CHECK(index >= 0 && index < images_.dim(0), describe(), ": row ", index, " is out of range [0, ",
             images_.dim(0), ")");
  return {internal::row_view(images_, index, image_shape_), internal::row_view(labels_, index, Shape())};
}

}  // namespace demi::data
