// The Dataset base: column names, the cached size, the default in-order pass of random-access datasets,
// and the global default seed. The pipeline operations live in pipeline.cc, the iterators in
// iterator.cc and prefetch.cc.
#include "demi/data/dataset.h"

#include <set>

#include "demi/core/error.h"
#include "demi/core/rng.h"
#include "demi/data/internal/util.h"

namespace demi::data {
namespace {

// Rows 0, 1, ..., size - 1 of a random-access dataset.
class IndexReader final : public RowReader {
 public:
  IndexReader(std::shared_ptr<const Dataset> ds, int64_t epoch)
      : ds_(std::move(ds)), epoch_(epoch), size_(ds_->get_dataset_size()) {}
  std::optional<Row> next() override {
    if (next_ >= size_) return std::nullopt;
    return ds_->get_row(next_++, epoch_);
  }

 private:
  std::shared_ptr<const Dataset> ds_;
  int64_t epoch_, size_;
  int64_t next_ = 0;
};

}  // namespace

Dataset::Dataset(std::vector<std::string> column_names) : column_names_(std::move(column_names)) {
  DEMI_CHECK(!column_names_.empty(), "a dataset needs at least one column name");
  std::set<std::string> seen;
  for (const auto& n : column_names_) {
    DEMI_CHECK(!n.empty(), "column names must not be empty (columns: ", internal::join_names(column_names_), ")");
    DEMI_CHECK(seen.insert(n).second, "column name '", n, "' appears twice (columns: ",
               internal::join_names(column_names_), ")");
  }
}

int Dataset::column_index(std::string_view name) const {
  for (size_t i = 0; i < column_names_.size(); ++i) {
    if (column_names_[i] == name) return static_cast<int>(i);
  }
  DEMI_CHECK(false, describe(), ": no column named '", name, "' (columns: ", internal::join_names(column_names_),
             ")");
  return -1;
}

int64_t Dataset::get_dataset_size() const {
  std::lock_guard<std::mutex> lock(size_mutex_);
  if (!size_) size_ = compute_size();
  return *size_;
}

Row Dataset::get_row(int64_t index, int64_t epoch) const {
  DEMI_CHECK(false, describe(), " has no random access (get_row(", index, ", ", epoch,
             ")): iterate it with create_iterator()");
  return {};
}

std::unique_ptr<RowReader> Dataset::open(int64_t epoch) const {
  DEMI_ASSERT(is_random_access(), describe(), " must implement open()");
  auto self = weak_from_this().lock();
  DEMI_CHECK(self != nullptr, describe(), ": datasets must be created with std::make_shared");
  return std::make_unique<IndexReader>(std::move(self), epoch);
}

uint64_t default_data_seed() { return default_generator().seed(); }

}  // namespace demi::data
