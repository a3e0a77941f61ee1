// Cifar10Dataset: finds the split's .bin files, sizes one buffer from their lengths, and decodes the
// records into it (internal/formats.cc), once, when the dataset is created.
#include "demi/data/cifar10.h"

#include <filesystem>

#include "demi/core/error.h"
#include "demi/data/internal/formats.h"
#include "demi/data/internal/util.h"

namespace demi::data {
namespace fs = std::filesystem;
namespace {

const std::vector<std::string>& train_files() {
  static const std::vector<std::string> f = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                             "data_batch_4.bin", "data_batch_5.bin"};
  return f;
}

}  // namespace

Cifar10Dataset::Cifar10Dataset(const std::string& dataset_dir, const std::string& usage)
    : Dataset({"image", "label"}), dir_(dataset_dir), usage_(usage) {
  DEMI_CHECK(usage == "train" || usage == "test" || usage == "all",
             "Cifar10Dataset: usage must be \"train\", \"test\" or \"all\", got \"", usage, "\"");
  std::error_code ec;
  DEMI_CHECK(fs::exists(dataset_dir, ec), "Cifar10Dataset: dataset directory '", dataset_dir, "' does not exist");
  DEMI_CHECK(fs::is_directory(dataset_dir, ec), "Cifar10Dataset: '", dataset_dir, "' is not a directory");

  std::vector<std::string> names;
  if (usage != "test") names = train_files();
  if (usage != "train") names.push_back("test_batch.bin");
  // The archive unpacks into cifar-10-batches-bin/: accept its parent too.
  fs::path dir = dataset_dir;
  if (!fs::exists(dir / names[0], ec) && fs::is_directory(dir / "cifar-10-batches-bin", ec)) {
    dir /= "cifar-10-batches-bin";
  }
  for (const auto& n : names) {
    DEMI_CHECK(fs::is_regular_file(dir / n, ec), "Cifar10Dataset: '", (dir / n).string(),
               "' not found; the CIFAR-10 binary format's directory holds data_batch_1.bin ... data_batch_5.bin "
               "(usage train) and test_batch.bin (usage test); '", dir.string(), "' holds ",
               internal::list_directory(dir));
    files_.push_back((dir / n).string());
  }

  // One buffer for the split, sized from the files' lengths (each checked to be whole records).
  int64_t total = 0;
  std::vector<int64_t> counts;
  for (const auto& f : files_) {
    uintmax_t bytes = fs::file_size(f, ec);
    DEMI_CHECK(!ec, f, ": cannot read its size (", ec.message(), ")");
    DEMI_CHECK(bytes > 0 && bytes % internal::kCifarRecordBytes == 0, f,
               ": truncated or not a CIFAR-10 binary file: ", bytes, " bytes is not a whole number of ",
               internal::kCifarRecordBytes, "-byte records (", bytes / internal::kCifarRecordBytes, " records and ",
               bytes % internal::kCifarRecordBytes, " bytes left over)");
    counts.push_back(static_cast<int64_t>(bytes / internal::kCifarRecordBytes));
    total += counts.back();
  }
  images_ = empty({total, 3, 32, 32}, DType::kU8, MemCategory::kData);
  labels_ = empty({total}, DType::kI32, MemCategory::kData);
  int64_t at = 0;
  for (size_t i = 0; i < files_.size(); ++i) {
    std::vector<uint8_t> bytes = internal::read_file(files_[i]);
    int64_t n = internal::cifar10_record_count(bytes, files_[i]);
    DEMI_CHECK(n == counts[i], files_[i], ": changed size while being read (", counts[i], " records, then ", n, ")");
    internal::decode_cifar10(bytes, files_[i], images_.data<uint8_t>() + at * internal::kCifarImageBytes,
                             labels_.data<int32_t>() + at);
    at += n;
  }
}

std::string Cifar10Dataset::describe() const { return str_cat("Cifar10Dataset(", dir_, ", ", usage_, ")"); }

Row Cifar10Dataset::get_row(int64_t index, int64_t) const {
  DEMI_CHECK(index >= 0 && index < images_.dim(0), describe(), ": row ", index, " is out of range [0, ",
             images_.dim(0), ")");
  return {internal::row_view(images_, index, Shape{3, 32, 32}), internal::row_view(labels_, index, Shape())};
}

}  // namespace demi::data
