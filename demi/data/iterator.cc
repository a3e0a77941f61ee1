// The synchronous iterator (the pipeline runs inside next(), on the caller's thread) and
// Dataset::create_iterator, which picks it or the Prefetcher.
#include "demi/data/iterator.h"

#include <chrono>
#include <exception>

#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/data/prefetch.h"

namespace demi::data {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

class SyncIterator final : public Iterator {
 public:
  SyncIterator(std::shared_ptr<const Dataset> ds, int64_t first_epoch, int64_t first_position)
      : Iterator(std::move(ds)), epoch_(first_epoch), skip_(first_position), window_start_(Clock::now()) {}

  std::optional<Row> next() override {
    // After an error the pass is broken: rethrow until reset() rather than go on with a short epoch.
    if (failed_) std::rethrow_exception(failed_);
    if (done_) return std::nullopt;
    // Everything the pipeline allocates is input data, whichever thread runs it.
    MemCategoryScope scope(MemCategory::kData);
    auto t0 = Clock::now();
    std::optional<Row> row;
    try {
      if (!reader_) {
        reader_ = dataset_->open(epoch_);
        // A resumed run passes over the rows its first epoch had already delivered.
        for (; skip_ > 0; --skip_, ++position_) {
          if (!reader_->next()) break;
        }
      }
      row = reader_->next();
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
    double dt = seconds_since(t0);
    wait_ += dt;
    if (!row) {
      done_ = true;
      reader_.reset();
      return std::nullopt;
    }
    ++position_;
    ++rows_;
    return row;
  }

  void reset() override {
    ++epoch_;
    position_ = 0;
    skip_ = 0;
    done_ = false;
    failed_ = nullptr;
    reader_.reset();
  }
  int64_t epoch() const override { return epoch_; }
  int64_t position() const override { return position_; }

  IteratorStats stats() const override {
    IteratorStats s;
    s.rows = rows_;
    s.wait_seconds = wait_;
    s.producer_busy_seconds = wait_;
    s.elapsed_seconds = seconds_since(window_start_);
    return s;
  }
  void reset_stats() override {
    rows_ = 0;
    wait_ = 0;
    window_start_ = Clock::now();
  }

 private:
  int64_t epoch_;
  int64_t skip_;  // rows still to pass over at the start of the first epoch
  int64_t position_ = 0;
  bool done_ = false;
  std::exception_ptr failed_;
  std::unique_ptr<RowReader> reader_;
  int64_t rows_ = 0;
  double wait_ = 0;
  Clock::time_point window_start_;
};

}  // namespace

Iterator::Iterator(std::shared_ptr<const Dataset> dataset) : dataset_(std::move(dataset)) {
  DEMI_CHECK(dataset_ != nullptr, "an iterator needs a dataset, got null");
}

std::optional<std::map<std::string, Tensor>> Iterator::next_dict() {
  auto row = next();
  if (!row) return std::nullopt;
  std::map<std::string, Tensor> out;
  const auto& names = column_names();
  for (size_t i = 0; i < names.size(); ++i) out.emplace(names[i], std::move((*row)[i]));
  return out;
}

std::unique_ptr<Iterator> Dataset::create_iterator(IteratorOptions options) const {
  auto self = weak_from_this().lock();
  DEMI_CHECK(self != nullptr, describe(), ": datasets must be created with std::make_shared");
  DEMI_CHECK(options.prefetch >= 0, describe(), ": create_iterator's prefetch must be >= 0, got ", options.prefetch);
  DEMI_CHECK(options.epoch >= 0 && options.position >= 0, describe(),
             ": create_iterator's first epoch and position must be >= 0, got ", options.epoch, " and ",
             options.position);
  if (options.prefetch > 0) {
    return std::make_unique<Prefetcher>(std::move(self), options.prefetch, options);
  }
  return std::make_unique<SyncIterator>(std::move(self), options.epoch, options.position);
}

}  // namespace demi::data
