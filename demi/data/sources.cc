// GeneratorDataset and NumpySlicesDataset; see sources.h.
#include "demi/data/sources.h"

#include <exception>

#include "demi/core/error.h"
#include "demi/data/internal/util.h"

namespace demi::data {
namespace {

using internal::join_names;
using internal::signature;

// One pass of a generator: checks each row and that the row count matches a declared num_rows.
class GeneratorReader final : public RowReader {
 public:
  GeneratorReader(std::shared_ptr<const GeneratorDataset> ds, int64_t epoch)
      : ds_(std::move(ds)), gen_(ds_->make_generator(epoch)) {}

  std::optional<Row> next() override {
    if (done_) return std::nullopt;
    const int64_t declared = ds_->options().num_rows;
    std::optional<Row> row;
    try {
      row = gen_();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(str_cat(ds_->describe(), ": the source threw while making row ", index_, ": ", e.what()));
    }
    if (!row) {
      done_ = true;
      DEMI_CHECK(declared < 0 || index_ == declared, ds_->describe(), ": the source ended after ", index_,
                 " rows, but num_rows declares ", declared, " (an epoch would silently be short)");
      return std::nullopt;
    }
    DEMI_CHECK(declared < 0 || index_ < declared, ds_->describe(), ": the source yielded more than the ",
               declared, " rows num_rows declares");
    ds_->check_row(*row, index_, first_, first_index_);
    ++index_;
    return row;
  }

 private:
  std::shared_ptr<const GeneratorDataset> ds_;
  RowGenerator gen_;
  int64_t index_ = 0;
  bool done_ = false;
  std::vector<Tensor> first_;
  int64_t first_index_ = -1;
};

}  // namespace

// ---- GeneratorDataset ----

GeneratorDataset::GeneratorDataset(GeneratorSource source, std::vector<std::string> column_names,
                                   GeneratorOptions options)
    : Dataset(std::move(column_names)), options_(options) {
  DEMI_CHECK(source != nullptr, describe(), ": the source is empty");
  source_ = [src = std::move(source)](int64_t) { return src(); };
}

GeneratorDataset::GeneratorDataset(EpochGeneratorSource source, std::vector<std::string> column_names,
                                   GeneratorOptions options)
    : Dataset(std::move(column_names)), source_(std::move(source)), options_(options) {
  DEMI_CHECK(source_ != nullptr, describe(), ": the source is empty");
}

GeneratorDataset::GeneratorDataset(RandomAccessSource source, std::vector<std::string> column_names,
                                   GeneratorOptions options)
    : Dataset(std::move(column_names)), random_access_(std::move(source)), options_(options) {
  DEMI_CHECK(random_access_.get != nullptr, describe(), ": the random-access source has no get function");
  DEMI_CHECK(random_access_.size >= 0, describe(), ": the random-access source's size must be >= 0, got ",
             random_access_.size);
  DEMI_CHECK(options_.num_rows < 0 || options_.num_rows == random_access_.size, describe(), ": num_rows ",
             options_.num_rows, " differs from the random-access source's size ", random_access_.size);
}

std::string GeneratorDataset::describe() const { return str_cat("GeneratorDataset(", join_names(column_names()), ")"); }

RowGenerator GeneratorDataset::make_generator(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(source_mutex_);
  RowGenerator gen = source_(epoch);
  DEMI_CHECK(gen != nullptr, describe(), ": the source returned an empty generator for epoch ", epoch);
  return gen;
}

void GeneratorDataset::check_row(const Row& row, int64_t index, std::vector<Tensor>& first,
                                 int64_t& first_index) const {
  const auto& names = column_names();
  DEMI_CHECK(row.size() == names.size(), describe(), ": row ", index, " has ", row.size(), " column(s) but ",
             names.size(), " are named (", join_names(names), ")");
  for (size_t c = 0; c < row.size(); ++c) {
    DEMI_CHECK(row[c].defined(), describe(), ": row ", index, ", column '", names[c], "' is an undefined tensor");
  }
  if (!options_.check_shapes) return;
  if (first.empty()) {
    first = row;
    first_index = index;
    return;
  }
  for (size_t c = 0; c < row.size(); ++c) {
    DEMI_CHECK(row[c].dtype() == first[c].dtype() && row[c].shape() == first[c].shape(), describe(), ": row ",
               index, ", column '", names[c], "': expected ", signature(first[c]), " like row ", first_index,
               ", got ", signature(row[c]));
  }
}

Row GeneratorDataset::get_row(int64_t index, int64_t) const {
  DEMI_ASSERT(is_random_access());
  DEMI_CHECK(index >= 0 && index < random_access_.size, describe(), ": row ", index, " is out of range [0, ",
             random_access_.size, ")");
  Row row;
  try {
    std::lock_guard<std::mutex> lock(source_mutex_);
    row = random_access_.get(index);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(str_cat(describe(), ": the source threw while making row ", index, ": ", e.what()));
  }
  std::lock_guard<std::mutex> lock(first_mutex_);
  check_row(row, index, first_, first_index_);
  return row;
}

std::unique_ptr<RowReader> GeneratorDataset::open(int64_t epoch) const {
  if (is_random_access()) return Dataset::open(epoch);
  auto self = std::static_pointer_cast<const GeneratorDataset>(weak_from_this().lock());
  DEMI_CHECK(self != nullptr, describe(), ": datasets must be created with std::make_shared");
  return std::make_unique<GeneratorReader>(std::move(self), epoch);
}

int64_t GeneratorDataset::compute_size() const {
  if (is_random_access()) return random_access_.size;
  if (options_.num_rows >= 0) return options_.num_rows;
  // Unknown: count one pass of epoch 0 (rows are not checked here; the real passes check them).
  RowGenerator gen = make_generator(0);
  int64_t n = 0;
  while (gen()) ++n;
  return n;
}

// ---- NumpySlicesDataset ----

NumpySlicesDataset::NumpySlicesDataset(std::vector<Tensor> columns, std::vector<std::string> column_names)
    : Dataset(std::move(column_names)), columns_(std::move(columns)) {
  const auto& names = this->column_names();
  DEMI_CHECK(columns_.size() == names.size(), "NumpySlicesDataset: ", columns_.size(), " column tensor(s) for ",
             names.size(), " column name(s) (", join_names(names), ")");
  for (size_t c = 0; c < columns_.size(); ++c) {
    const Tensor& t = columns_[c];
    DEMI_CHECK(t.defined(), "NumpySlicesDataset: column '", names[c], "' is an undefined tensor");
    DEMI_CHECK(t.rank() >= 1, "NumpySlicesDataset: column '", names[c], "' is ", t.describe(),
               "; expected rank >= 1 (rows along dimension 0)");
    if (c == 0) rows_ = t.dim(0);
    DEMI_CHECK(t.dim(0) == rows_, "NumpySlicesDataset: column '", names[c], "' ", t.describe(), " has ", t.dim(0),
               " rows but column '", names[0], "' has ", rows_);
    row_shapes_.push_back(internal::row_shape_of(t));
  }
}

std::string NumpySlicesDataset::describe() const {
  return str_cat("NumpySlicesDataset(", join_names(column_names()), ")");
}

Row NumpySlicesDataset::get_row(int64_t index, int64_t) const {
  DEMI_CHECK(index >= 0 && index < rows_, describe(), ": row ", index, " is out of range [0, ", rows_, ")");
  Row row;
  for (size_t c = 0; c < columns_.size(); ++c) row.push_back(internal::row_view(columns_[c], index, row_shapes_[c]));
  return row;
}

}  // namespace demi::data
