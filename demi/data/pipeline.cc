// The pipeline operations (map, shuffle, batch, repeat, take, skip, project): each a dataset that pulls
// from its input. They keep no per-epoch state themselves: a pass's state lives in its RowReader.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <thread>

#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/core/rng.h"
#include "demi/data/dataset.h"
#include "demi/data/internal/util.h"
#include "demi/data/transforms.h"

namespace demi::data {
namespace {

using internal::join_names;

std::shared_ptr<const Dataset> self_of(const Dataset& ds) {
  auto self = ds.weak_from_this().lock();
  DEMI_CHECK(self != nullptr, ds.describe(), ": datasets must be created with std::make_shared");
  return self;
}

// ---- map ----

class MapDataset final : public Dataset {
 public:
  MapDataset(std::shared_ptr<const Dataset> child, std::vector<Transform> ops, std::vector<int> columns,
             MapOptions options)
      : Dataset(child->column_names()),
        child_(std::move(child)),
        ops_(std::move(ops)),
        columns_(std::move(columns)),
        workers_(options.num_parallel_workers),
        seed_(options.seed.value_or(default_data_seed())),
        pairs_(ops_.size()) {
    for (size_t i = 0; i + 1 < ops_.size(); ++i) {
      const auto* rescale = dynamic_cast<const Rescale*>(&ops_[i].impl());
      const auto* normalize = dynamic_cast<const Normalize*>(&ops_[i + 1].impl());
      if (rescale != nullptr && normalize != nullptr)
        pairs_[i] = std::make_shared<const internal::RescaleNormalize>(*rescale, *normalize);
    }
  }

  std::string describe() const override {
    std::string names;
    for (size_t i = 0; i < ops_.size(); ++i) names += (i ? ", " : "") + ops_[i].name();
    std::vector<std::string> cols;
    for (int c : columns_) cols.push_back(column_names()[static_cast<size_t>(c)]);
    return str_cat("map([", names, "] on ", join_names(cols), ") <- ", child_->describe());
  }
  bool is_random_access() const override { return child_->is_random_access(); }
  Row get_row(int64_t index, int64_t epoch) const override { return apply(child_->get_row(index, epoch), index, epoch); }
  std::unique_ptr<RowReader> open(int64_t epoch) const override;

  // The row with every listed column transformed. Each column starts from the row's own key, so equally
  // shaped columns receive the same random decisions.
  Row apply(Row row, int64_t index, int64_t epoch) const {
    for (int c : columns_) {
      const std::string& col = column_names()[static_cast<size_t>(c)];
      Generator rng(internal::mix_seed(seed_, internal::kSaltMap, static_cast<uint64_t>(epoch),
                                       static_cast<uint64_t>(index)));
      Tensor x = row[static_cast<size_t>(c)];
      for (size_t i = 0; i < ops_.size(); ++i) {
        if (pairs_[i] != nullptr) {
          if (std::optional<Tensor> y = pairs_[i]->apply(x)) {  // this op and the next in one pass
            x = std::move(*y);
            ++i;
            continue;
          }
        }
        const Transform& op = ops_[i];
        try {
          x = op(x, rng);
        } catch (const InternalError&) {
          throw;
        } catch (const ForeignError&) {
          throw;
        } catch (const Error& e) {
          throw Error(str_cat("map: ", op.name(), " on column '", col, "' of row ", index, " (epoch ", epoch,
                              "): ", e.what()));
        }
      }
      row[static_cast<size_t>(c)] = std::move(x);
    }
    return row;
  }

  int workers() const { return workers_; }
  const std::shared_ptr<const Dataset>& child() const { return child_; }

 protected:
  int64_t compute_size() const override { return child_->get_dataset_size(); }

 private:
  std::shared_ptr<const Dataset> child_;
  std::vector<Transform> ops_;
  std::vector<int> columns_;
  int workers_;
  uint64_t seed_;
  // pairs_[i]: ops i and i + 1 are a Rescale and a Normalize, run on bytes in one pass (its apply() says
  // when it can); the pair holds the Normalize, which ops_ keeps alive.
  std::vector<std::shared_ptr<const internal::RescaleNormalize>> pairs_;
};

// The helper threads of one map pass: run(n, fn) calls fn(0) ... fn(n - 1) spread over the calling
// thread and workers - 1 helpers, and returns when every call has returned; fn must not throw. Plain
// std::threads rather than an OpenMP team, so that ThreadSanitizer sees every synchronization (it cannot
// see libgomp's barriers) and map's worker count stays independent of demi's compute threads.
class WorkerTeam {
 public:
  explicit WorkerTeam(int workers) {
    for (int i = 1; i < workers; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~WorkerTeam() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
  }
  WorkerTeam(const WorkerTeam&) = delete;
  WorkerTeam& operator=(const WorkerTeam&) = delete;

  void run(int64_t n, const std::function<void(int64_t)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      next_ = 0;
      busy_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    start_.notify_all();
    work(fn, n);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return busy_ == 0; });
    fn_ = nullptr;
  }

 private:
  void work(const std::function<void(int64_t)>& fn, int64_t n) {
    for (int64_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) fn(i);
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)>* fn;
      int64_t n;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
        n = n_;
      }
      work(*fn, n);
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  int busy_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Pulls rows from the input in order and transforms them, `workers` rows at a time in parallel when
// asked to. Row i of the pass is keyed by i whichever thread transforms it.
class MapReader final : public RowReader {
 public:
  MapReader(std::shared_ptr<const MapDataset> ds, int64_t epoch)
      : ds_(std::move(ds)), in_(ds_->child()->open(epoch)), epoch_(epoch) {
    if (ds_->workers() > 1) team_ = std::make_unique<WorkerTeam>(ds_->workers());
  }

  std::optional<Row> next() override {
    if (ready_.empty()) fill();
    if (ready_.empty()) return std::nullopt;
    Row r = std::move(ready_.front());
    ready_.pop_front();
    return r;
  }

 private:
  void fill() {
    const int w = ds_->workers();
    // Several rows per worker so that uneven rows still keep every worker busy.
    const int64_t chunk = w <= 1 ? 1 : 4 * static_cast<int64_t>(w);
    std::vector<Row> rows;
    for (int64_t k = 0; k < chunk; ++k) {
      auto r = in_->next();
      if (!r) break;
      rows.push_back(std::move(*r));
    }
    const int64_t n = static_cast<int64_t>(rows.size());
    const int64_t first = next_index_;
    next_index_ += n;
    if (w <= 1 || n <= 1) {
      for (int64_t i = 0; i < n; ++i) ready_.push_back(ds_->apply(std::move(rows[static_cast<size_t>(i)]), first + i, epoch_));
      return;
    }
    // Keep each row's exception and rethrow the first row's, so the error does not depend on timing.
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    const MemCategory cat = current_mem_category();  // the category is per thread: carry it to the workers
    team_->run(n, [&](int64_t i) {
      MemCategoryScope scope(cat);
      try {
        rows[static_cast<size_t>(i)] = ds_->apply(std::move(rows[static_cast<size_t>(i)]), first + i, epoch_);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    });
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    for (auto& r : rows) ready_.push_back(std::move(r));
  }

  std::shared_ptr<const MapDataset> ds_;
  std::unique_ptr<RowReader> in_;
  int64_t epoch_;
  int64_t next_index_ = 0;
  std::deque<Row> ready_;
  std::unique_ptr<WorkerTeam> team_;
};

std::unique_ptr<RowReader> MapDataset::open(int64_t epoch) const {
  return std::make_unique<MapReader>(std::static_pointer_cast<const MapDataset>(self_of(*this)), epoch);
}

// ---- shuffle ----

class ShuffleDataset final : public Dataset {
 public:
  ShuffleDataset(std::shared_ptr<const Dataset> child, int64_t buffer_size, uint64_t seed)
      : Dataset(child->column_names()), child_(std::move(child)), buffer_size_(buffer_size), seed_(seed) {}

  std::string describe() const override {
    return str_cat("shuffle(", buffer_size_, ") <- ", child_->describe());
  }
  std::unique_ptr<RowReader> open(int64_t epoch) const override;

  const std::shared_ptr<const Dataset>& child() const { return child_; }
  int64_t buffer_size() const { return buffer_size_; }
  uint64_t key(int64_t epoch) const {
    return internal::mix_seed(seed_, internal::kSaltShuffle, static_cast<uint64_t>(epoch));
  }

 protected:
  int64_t compute_size() const override { return child_->get_dataset_size(); }

 private:
  std::shared_ptr<const Dataset> child_;
  int64_t buffer_size_;
  uint64_t seed_;
};

// MindSpore's shuffle buffer: fill it with the first buffer_size inputs; then each output is a uniformly
// drawn slot, refilled with the next input (or, once the input is exhausted, with the last slot). Over
// a random-access input the buffer holds indices and rows are fetched when drawn, so a full shuffle of
// 60000 mapped images buffers 60000 integers, not 60000 images; both paths draw the same permutation.
template <typename Item>
class ShuffleBuffer {
 public:
  ShuffleBuffer(uint64_t key, int64_t capacity) : rng_(key), capacity_(capacity) {}

  // Calls pull() for inputs (nullopt when exhausted) and returns the next output, or nullopt at the end.
  template <typename Pull>
  std::optional<Item> next(Pull&& pull) {
    while (!input_done_ && static_cast<int64_t>(buf_.size()) < capacity_) {
      auto x = pull();
      if (!x) {
        input_done_ = true;
        break;
      }
      buf_.push_back(std::move(*x));
    }
    if (buf_.empty()) return std::nullopt;
    auto slot = static_cast<size_t>(rng_.next_int(static_cast<int64_t>(buf_.size())));
    Item out = std::move(buf_[slot]);
    std::optional<Item> refill;
    if (!input_done_) {
      refill = pull();
      if (!refill) input_done_ = true;
    }
    if (refill) {
      buf_[slot] = std::move(*refill);
    } else {
      if (slot + 1 != buf_.size()) buf_[slot] = std::move(buf_.back());
      buf_.pop_back();
    }
    return out;
  }

 private:
  Generator rng_;
  int64_t capacity_;
  std::vector<Item> buf_;
  bool input_done_ = false;
};

class ShuffleRowReader final : public RowReader {
 public:
  ShuffleRowReader(const ShuffleDataset& ds, int64_t epoch)
      : in_(ds.child()->open(epoch)), buf_(ds.key(epoch), ds.buffer_size()) {}
  std::optional<Row> next() override {
    return buf_.next([this] { return in_->next(); });
  }

 private:
  std::unique_ptr<RowReader> in_;
  ShuffleBuffer<Row> buf_;
};

class ShuffleIndexReader final : public RowReader {
 public:
  ShuffleIndexReader(const ShuffleDataset& ds, int64_t epoch)
      : child_(ds.child()),
        epoch_(epoch),
        size_(child_->get_dataset_size()),
        buf_(ds.key(epoch), std::min(ds.buffer_size(), std::max<int64_t>(size_, 1))) {}
  std::optional<Row> next() override {
    auto i = buf_.next([this]() -> std::optional<int64_t> {
      if (next_ >= size_) return std::nullopt;
      return next_++;
    });
    if (!i) return std::nullopt;
    return child_->get_row(*i, epoch_);
  }

 private:
  std::shared_ptr<const Dataset> child_;
  int64_t epoch_, size_;
  int64_t next_ = 0;
  ShuffleBuffer<int64_t> buf_;
};

std::unique_ptr<RowReader> ShuffleDataset::open(int64_t epoch) const {
  if (child_->is_random_access()) return std::make_unique<ShuffleIndexReader>(*this, epoch);
  return std::make_unique<ShuffleRowReader>(*this, epoch);
}

// ---- batch ----

class BatchDataset final : public Dataset {
 public:
  BatchDataset(std::shared_ptr<const Dataset> child, int64_t batch_size, bool drop_remainder)
      : Dataset(child->column_names()), child_(std::move(child)), batch_size_(batch_size), drop_(drop_remainder) {}

  std::string describe() const override {
    return str_cat("batch(", batch_size_, drop_ ? ", drop_remainder" : "", ") <- ", child_->describe());
  }
  std::unique_ptr<RowReader> open(int64_t epoch) const override;

  const std::shared_ptr<const Dataset>& child() const { return child_; }
  int64_t batch_size() const { return batch_size_; }
  bool drop_remainder() const { return drop_; }

 protected:
  int64_t compute_size() const override {
    int64_t n = child_->get_dataset_size();
    if (n == kInfiniteSize) return kInfiniteSize;
    return drop_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  }

 private:
  std::shared_ptr<const Dataset> child_;
  int64_t batch_size_;
  bool drop_;
};

class BatchReader final : public RowReader {
 public:
  BatchReader(const BatchDataset& ds, int64_t epoch)
      : name_(str_cat("batch(", ds.batch_size(), ")")),
        columns_(ds.column_names()),
        in_(ds.child()->open(epoch)),
        batch_size_(ds.batch_size()),
        drop_(ds.drop_remainder()) {}

  std::optional<Row> next() override {
    if (done_) return std::nullopt;
    std::vector<Row> rows;
    rows.reserve(static_cast<size_t>(std::min<int64_t>(batch_size_, 4096)));
    while (static_cast<int64_t>(rows.size()) < batch_size_) {
      auto r = in_->next();
      if (!r) {
        done_ = true;
        break;
      }
      rows.push_back(std::move(*r));
    }
    const int64_t first = rows_seen_;
    rows_seen_ += static_cast<int64_t>(rows.size());
    if (rows.empty() || (drop_ && static_cast<int64_t>(rows.size()) < batch_size_)) return std::nullopt;
    return stack(rows, first);
  }

 private:
  // One (B, ...) tensor per column; `first` is the pass index of rows[0], for error messages.
  Row stack(const std::vector<Row>& rows, int64_t first) const {
    const int64_t b = static_cast<int64_t>(rows.size());
    Row out;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const Tensor& head = rows[0][c];
      for (int64_t k = 1; k < b; ++k) {
        const Tensor& t = rows[static_cast<size_t>(k)][c];
        DEMI_CHECK(t.dtype() == head.dtype() && t.shape() == head.shape(), name_, ": column '", columns_[c],
                   "' of row ", first + k, " is ", internal::signature(t), " but row ", first,
                   ", the first of its batch, is ", internal::signature(head),
                   "; rows batched together must agree (resize or pad them in a map first)");
      }
      DEMI_CHECK(head.rank() < Shape::kMaxRank, name_, ": column '", columns_[c], "' rows are ",
                 internal::signature(head), ", already of the maximum rank ", Shape::kMaxRank);
      Shape s;
      s.push_back(b);
      for (int i = 0; i < head.rank(); ++i) s.push_back(head.dim(i));
      Tensor t = empty(s, head.dtype());
      const size_t row_bytes = head.nbytes();
      auto* dst = static_cast<uint8_t*>(t.raw_data());
      for (int64_t k = 0; k < b && row_bytes > 0; ++k) {
        std::memcpy(dst + static_cast<size_t>(k) * row_bytes, rows[static_cast<size_t>(k)][c].raw_data(), row_bytes);
      }
      out.push_back(std::move(t));
    }
    return out;
  }

  std::string name_;
  std::vector<std::string> columns_;
  std::unique_ptr<RowReader> in_;
  int64_t batch_size_;
  bool drop_;
  bool done_ = false;
  int64_t rows_seen_ = 0;
};

std::unique_ptr<RowReader> BatchDataset::open(int64_t epoch) const { return std::make_unique<BatchReader>(*this, epoch); }

// ---- repeat ----

class RepeatDataset final : public Dataset {
 public:
  RepeatDataset(std::shared_ptr<const Dataset> child, int64_t count)
      : Dataset(child->column_names()), child_(std::move(child)), count_(count) {}

  std::string describe() const override { return str_cat("repeat(", count_, ") <- ", child_->describe()); }
  std::unique_ptr<RowReader> open(int64_t epoch) const override;

  const std::shared_ptr<const Dataset>& child() const { return child_; }
  int64_t count() const { return count_; }

 protected:
  int64_t compute_size() const override {
    int64_t n = child_->get_dataset_size();
    if (count_ < 0 || n == kInfiniteSize) return kInfiniteSize;
    auto total = internal::checked_mul(static_cast<uint64_t>(n), static_cast<uint64_t>(count_));
    DEMI_CHECK(total && *total <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), describe(),
               ": ", n, " rows repeated ", count_, " times overflows");
    return static_cast<int64_t>(*total);
  }

 private:
  std::shared_ptr<const Dataset> child_;
  int64_t count_;
};

class RepeatReader final : public RowReader {
 public:
  RepeatReader(const RepeatDataset& ds, int64_t epoch) : ds_(ds), epoch_(epoch) {}

  std::optional<Row> next() override {
    const int64_t count = ds_.count();
    for (;;) {
      if (!in_) {
        if (count >= 0 && rep_ >= count) return std::nullopt;
        // Each repetition is a pass of its own: the input re-shuffles and re-draws its augmentations.
        int64_t child_epoch = count >= 0 ? epoch_ * count + rep_ : (epoch_ << 32) + rep_;
        in_ = ds_.child()->open(child_epoch);
        rows_this_rep_ = 0;
      }
      auto r = in_->next();
      if (r) {
        ++rows_this_rep_;
        return r;
      }
      DEMI_CHECK(count >= 0 || rows_this_rep_ > 0, ds_.describe(), ": the input yielded no rows, so repeating it forever would never yield one");
      in_.reset();
      ++rep_;
    }
  }

 private:
  const RepeatDataset& ds_;
  int64_t epoch_;
  int64_t rep_ = 0;
  int64_t rows_this_rep_ = 0;
  std::unique_ptr<RowReader> in_;
};

std::unique_ptr<RowReader> RepeatDataset::open(int64_t epoch) const {
  // The reader refers to the dataset: keep it alive as long as the reader.
  struct Owning final : RowReader {
    std::shared_ptr<const Dataset> keep;
    RepeatReader reader;
    Owning(std::shared_ptr<const Dataset> k, const RepeatDataset& ds, int64_t e) : keep(std::move(k)), reader(ds, e) {}
    std::optional<Row> next() override { return reader.next(); }
  };
  return std::make_unique<Owning>(self_of(*this), *this, epoch);
}

// ---- take, skip ----

// take (skip == false) keeps the first `count` rows, skip drops them.
class SliceDataset final : public Dataset {
 public:
  SliceDataset(std::shared_ptr<const Dataset> child, int64_t count, bool skip)
      : Dataset(child->column_names()), child_(std::move(child)), count_(count), skip_(skip) {}

  std::string describe() const override {
    return str_cat(skip_ ? "skip(" : "take(", count_, ") <- ", child_->describe());
  }
  bool is_random_access() const override { return child_->is_random_access(); }
  Row get_row(int64_t index, int64_t epoch) const override {
    return child_->get_row(skip_ ? index + count_ : index, epoch);
  }
  std::unique_ptr<RowReader> open(int64_t epoch) const override {
    if (is_random_access()) return Dataset::open(epoch);  // rows by index: skipping costs nothing
    struct Reader final : RowReader {
      std::unique_ptr<RowReader> in;
      int64_t count;
      bool skip;
      int64_t seen = 0;
      std::optional<Row> next() override {
        if (skip) {
          for (; seen < count; ++seen) {
            if (!in->next()) return std::nullopt;
          }
          return in->next();
        }
        if (seen >= count) return std::nullopt;
        ++seen;
        return in->next();
      }
    };
    auto r = std::make_unique<Reader>();
    r->in = child_->open(epoch);
    r->count = count_;
    r->skip = skip_;
    return r;
  }

 protected:
  int64_t compute_size() const override {
    int64_t n = child_->get_dataset_size();
    if (n == kInfiniteSize) return skip_ ? kInfiniteSize : count_;
    return skip_ ? std::max<int64_t>(0, n - count_) : std::min(n, count_);
  }

 private:
  std::shared_ptr<const Dataset> child_;
  int64_t count_;
  bool skip_;
};

// ---- project ----

class ProjectDataset final : public Dataset {
 public:
  ProjectDataset(std::shared_ptr<const Dataset> child, std::vector<std::string> columns, std::vector<int> indices)
      : Dataset(std::move(columns)), child_(std::move(child)), indices_(std::move(indices)) {}

  std::string describe() const override {
    return str_cat("project(", join_names(column_names()), ") <- ", child_->describe());
  }
  bool is_random_access() const override { return child_->is_random_access(); }
  Row get_row(int64_t index, int64_t epoch) const override { return pick(child_->get_row(index, epoch)); }
  std::unique_ptr<RowReader> open(int64_t epoch) const override {
    if (is_random_access()) return Dataset::open(epoch);
    struct Reader final : RowReader {
      std::shared_ptr<const ProjectDataset> ds;
      std::unique_ptr<RowReader> in;
      std::optional<Row> next() override {
        auto r = in->next();
        if (!r) return std::nullopt;
        return ds->pick(std::move(*r));
      }
    };
    auto r = std::make_unique<Reader>();
    r->ds = std::static_pointer_cast<const ProjectDataset>(self_of(*this));
    r->in = child_->open(epoch);
    return r;
  }
  Row pick(Row row) const {
    Row out;
    for (int i : indices_) out.push_back(std::move(row[static_cast<size_t>(i)]));
    return out;
  }

 protected:
  int64_t compute_size() const override { return child_->get_dataset_size(); }

 private:
  std::shared_ptr<const Dataset> child_;
  std::vector<int> indices_;
};

// ---- shard ----

// Rows in groups of `group` dealt round-robin to `num_shards` shards; this is shard `shard_id`. Epoch
// `start_epoch` first passes over `start_offset` rows of the input.
class ShardDataset final : public Dataset {
 public:
  ShardDataset(std::shared_ptr<const Dataset> child, const DistributedSampler& s, int64_t group)
      : Dataset(child->column_names()), child_(std::move(child)), s_(s), group_(group) {}

  std::string describe() const override {
    return str_cat("shard(", s_.shard_id, " of ", s_.num_shards, group_ > 1 ? str_cat(", groups of ", group_) : "",
                   ") <- ", child_->describe());
  }
  bool is_random_access() const override { return child_->is_random_access(); }
  Row get_row(int64_t index, int64_t epoch) const override { return child_->get_row(child_index(index, epoch), epoch); }
  std::unique_ptr<RowReader> open(int64_t epoch) const override {
    struct Reader final : RowReader {
      std::shared_ptr<const ShardDataset> ds;
      std::unique_ptr<RowReader> in;  // null: random access
      int64_t epoch = 0, rows = 0, next_index = 0, input_seen = 0;
      std::optional<Row> next() override {
        if (!in) {
          if (next_index >= rows) return std::nullopt;
          return ds->get_row(next_index++, epoch);
        }
        const int64_t offset = ds->offset(epoch);
        for (;;) {
          auto r = in->next();
          if (!r) return std::nullopt;
          const int64_t i = input_seen++;
          if (i >= offset && ds->owns(i - offset)) return r;
        }
      }
    };
    auto r = std::make_unique<Reader>();
    r->ds = std::static_pointer_cast<const ShardDataset>(self_of(*this));
    r->epoch = epoch;
    if (is_random_access()) {
      r->rows = rows_of(child_->get_dataset_size() - offset(epoch));
    } else {
      r->in = child_->open(epoch);
    }
    return r;
  }

 protected:
  int64_t compute_size() const override {
    int64_t n = child_->get_dataset_size();
    return n == kInfiniteSize ? kInfiniteSize : rows_of(n);
  }

 private:
  int64_t offset(int64_t epoch) const { return epoch == s_.start_epoch ? s_.start_offset : 0; }
  bool owns(int64_t i) const { return (i / group_) % s_.num_shards == s_.shard_id; }
  // The input row of this shard's row `index`.
  int64_t child_index(int64_t index, int64_t epoch) const {
    return offset(epoch) + ((index / group_) * s_.num_shards + s_.shard_id) * group_ + index % group_;
  }
  // This shard's rows out of n input rows.
  int64_t rows_of(int64_t n) const {
    if (n <= 0) return 0;
    const int64_t p = s_.num_shards, r = s_.shard_id, full = n / group_, rem = n % group_;
    const int64_t groups = full > r ? (full - r + p - 1) / p : 0;
    return groups * group_ + (rem > 0 && full % p == r ? rem : 0);
  }

  std::shared_ptr<const Dataset> child_;
  DistributedSampler s_;
  int64_t group_;
};

}  // namespace

// ---- The Dataset methods that build them ----

std::shared_ptr<Dataset> Dataset::map(std::vector<Transform> operations, std::vector<std::string> input_columns,
                                      MapOptions options) const {
  DEMI_CHECK(!operations.empty(), describe(), ": map needs at least one operation");
  DEMI_CHECK(options.num_parallel_workers >= 1, describe(), ": map's num_parallel_workers must be >= 1, got ",
             options.num_parallel_workers);
  if (input_columns.empty()) input_columns.push_back(column_names()[0]);
  std::vector<int> cols;
  for (const auto& name : input_columns) {
    int c = column_index(name);
    DEMI_CHECK(std::find(cols.begin(), cols.end(), c) == cols.end(), describe(), ": map lists column '", name,
               "' twice");
    cols.push_back(c);
  }
  return std::make_shared<MapDataset>(self_of(*this), std::move(operations), std::move(cols), options);
}

std::shared_ptr<Dataset> Dataset::shuffle(int64_t buffer_size, std::optional<uint64_t> seed) const {
  DEMI_CHECK(buffer_size >= 1, describe(), ": shuffle's buffer_size must be >= 1, got ", buffer_size);
  return std::make_shared<ShuffleDataset>(self_of(*this), buffer_size, seed.value_or(default_data_seed()));
}

std::shared_ptr<Dataset> Dataset::shard(const DistributedSampler& s) const {
  DEMI_CHECK(s.num_shards >= 1 && s.shard_id >= 0 && s.shard_id < s.num_shards, describe(),
             ": shard needs 0 <= shard_id < num_shards, got shard ", s.shard_id, " of ", s.num_shards);
  DEMI_CHECK(s.start_offset >= 0 && s.start_epoch >= 0, describe(), ": shard's start (epoch ", s.start_epoch,
             ", row ", s.start_offset, ") must not be negative");
  if (const auto* b = dynamic_cast<const BatchDataset*>(this); b != nullptr && b->child()->is_random_access()) {
    DistributedSampler rows = s;
    auto offset = internal::checked_mul(static_cast<uint64_t>(s.start_offset), static_cast<uint64_t>(b->batch_size()));
    DEMI_CHECK(offset && *offset <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), describe(),
               ": shard's start row ", s.start_offset, " overflows in rows");
    rows.start_offset = static_cast<int64_t>(*offset);
    return std::make_shared<BatchDataset>(std::make_shared<ShardDataset>(b->child(), rows, b->batch_size()),
                                          b->batch_size(), b->drop_remainder());
  }
  return std::make_shared<ShardDataset>(self_of(*this), s, 1);
}

std::shared_ptr<Dataset> Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  DEMI_CHECK(batch_size >= 1, describe(), ": batch_size must be >= 1, got ", batch_size);
  return std::make_shared<BatchDataset>(self_of(*this), batch_size, drop_remainder);
}

std::shared_ptr<Dataset> Dataset::repeat(int64_t count) const {
  DEMI_CHECK(count >= 1 || count == -1, describe(), ": repeat's count must be >= 1, or -1 for forever; got ", count);
  return std::make_shared<RepeatDataset>(self_of(*this), count);
}

std::shared_ptr<Dataset> Dataset::take(int64_t count) const {
  DEMI_CHECK(count >= 0, describe(), ": take's count must be >= 0, got ", count);
  return std::make_shared<SliceDataset>(self_of(*this), count, false);
}

std::shared_ptr<Dataset> Dataset::skip(int64_t count) const {
  DEMI_CHECK(count >= 0, describe(), ": skip's count must be >= 0, got ", count);
  return std::make_shared<SliceDataset>(self_of(*this), count, true);
}

std::shared_ptr<Dataset> Dataset::project(std::vector<std::string> columns) const {
  std::vector<int> idx;
  for (const auto& c : columns) idx.push_back(column_index(c));
  return std::make_shared<ProjectDataset>(self_of(*this), std::move(columns), std::move(idx));
}

}  // namespace demi::data
