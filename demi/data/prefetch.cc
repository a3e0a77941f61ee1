// The Prefetcher: one producer thread, a bounded queue guarded by one mutex and two condition variables,
// and exceptions carried across as std::exception_ptr. See prefetch.h.
#include "demi/data/prefetch.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "demi/core/error.h"
#include "demi/core/memory.h"

namespace demi::data {
namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

struct Prefetcher::State {
  // A row of an epoch, that epoch's end (no row), or the producer's error.
  struct Item {
    int64_t epoch = 0;
    std::optional<Row> row;
    std::exception_ptr error;
  };

  std::mutex mu;
  std::condition_variable not_empty;  // the consumer waits on it
  std::condition_variable not_full;   // the producer waits on it
  std::deque<Item> queue;
  bool stop = false;           // the destructor asks the producer to finish
  bool producer_done = false;  // the producer has returned
  int64_t wanted_epoch = 0;    // the consumer's epoch: the producer abandons any older one

  // Consumer side.
  int64_t epoch = 0;
  int64_t position = 0;
  bool epoch_done = false;
  std::exception_ptr failed;  // sticky: every next() after an error rethrows it

  // Measurements (guarded by mu).
  int64_t rows = 0;
  double wait = 0, busy = 0, blocked = 0;
  Clock::time_point window_start = Clock::now();

  std::thread thread;
};

Prefetcher::Prefetcher(std::shared_ptr<const Dataset> dataset, int queue_depth, IteratorOptions options)
    : Iterator(std::move(dataset)),
      depth_(queue_depth),
      first_epoch_(options.epoch),
      first_position_(options.position),
      num_epochs_(options.num_epochs),
      s_(std::make_unique<State>()) {
  DEMI_CHECK(queue_depth >= 1, "Prefetcher: queue_depth must be >= 1, got ", queue_depth);
  DEMI_CHECK(first_epoch_ >= 0 && first_position_ >= 0,
             "Prefetcher: the first epoch and position must be >= 0, got ", first_epoch_, " and ", first_position_);
  DEMI_CHECK(num_epochs_ >= 0 || num_epochs_ == -1, "Prefetcher: num_epochs must be >= 0, or -1 for no limit; got ",
             num_epochs_);
  s_->epoch = first_epoch_;
  s_->position = first_position_;
  s_->wanted_epoch = first_epoch_;
  s_->thread = std::thread([this] { produce(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stop = true;
  }
  s_->not_full.notify_all();
  s_->not_empty.notify_all();
  if (s_->thread.joinable()) s_->thread.join();
}

void Prefetcher::produce() {
  State& s = *s_;
  MemCategoryScope scope(MemCategory::kData);
  const int64_t end = num_epochs_ < 0 ? std::numeric_limits<int64_t>::max() : first_epoch_ + num_epochs_;
  int64_t e = first_epoch_;
  try {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(s.mu);
        if (s.stop) break;
        e = std::max(e, s.wanted_epoch);
        if (e >= end) break;
      }
      auto t_open = Clock::now();
      std::unique_ptr<RowReader> reader = dataset_->open(e);
      // A resumed run passes over the rows its first epoch had already delivered.
      if (e == first_epoch_) {
        for (int64_t k = 0; k < first_position_ && reader->next(); ++k) {
        }
      }
      Clock::duration open_time = Clock::now() - t_open;
      for (bool first = true;; first = false) {
        auto t0 = Clock::now();
        std::optional<Row> row = reader->next();
        Clock::duration made = Clock::now() - t0 + (first ? open_time : Clock::duration::zero());
        const bool end_of_epoch = !row.has_value();

        std::unique_lock<std::mutex> lock(s.mu);
        s.busy += seconds(made);
        auto t_block = Clock::now();
        s.not_full.wait(lock, [&] {
          return s.stop || static_cast<int>(s.queue.size()) < depth_ || s.wanted_epoch > e;
        });
        s.blocked += seconds(Clock::now() - t_block);
        if (s.stop) {
          s.producer_done = true;
          s.not_empty.notify_all();
          return;
        }
        if (s.wanted_epoch > e) break;  // the consumer moved on: abandon this epoch
        s.queue.push_back(State::Item{e, std::move(row), nullptr});
        s.not_empty.notify_one();
        if (end_of_epoch) break;
      }
      ++e;
    }
  } catch (...) {
    // Delivered whatever the queue holds: an error is never dropped, and the producer stops here.
    std::lock_guard<std::mutex> lock(s.mu);
    s.queue.push_back(State::Item{e, std::nullopt, std::current_exception()});
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.producer_done = true;
  s.not_empty.notify_all();
}

std::optional<Row> Prefetcher::next() {
  State& s = *s_;
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.failed) std::rethrow_exception(s.failed);
  if (s.epoch_done) return std::nullopt;
  auto t0 = Clock::now();
  for (;;) {
    s.not_empty.wait(lock, [&] { return !s.queue.empty() || s.producer_done; });
    if (s.queue.empty()) {
      // The producer finished its num_epochs epochs before this one: nothing more will come.
      s.wait += seconds(Clock::now() - t0);
      s.epoch_done = true;
      return std::nullopt;
    }
    State::Item item = std::move(s.queue.front());
    s.queue.pop_front();
    s.not_full.notify_one();
    if (item.error) {
      s.wait += seconds(Clock::now() - t0);
      s.failed = item.error;
      std::rethrow_exception(s.failed);
    }
    if (item.epoch < s.epoch) continue;  // left over from an epoch abandoned by reset()
    DEMI_ASSERT(item.epoch == s.epoch, "prefetched epoch ", item.epoch, " while consuming epoch ", s.epoch);
    s.wait += seconds(Clock::now() - t0);
    if (!item.row) {
      s.epoch_done = true;
      return std::nullopt;
    }
    ++s.position;
    ++s.rows;
    return std::move(item.row);
  }
}

void Prefetcher::reset() {
  State& s = *s_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.epoch;
    s.position = 0;
    s.epoch_done = false;
    s.wanted_epoch = s.epoch;
    // Free the queue of the abandoned epoch's rows now, so the producer has room for the new one.
    std::erase_if(s.queue, [&](const State::Item& it) { return !it.error && it.epoch < s.epoch; });
  }
  s.not_full.notify_all();
}

int64_t Prefetcher::epoch() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->epoch;
}

int64_t Prefetcher::position() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->position;
}

IteratorStats Prefetcher::stats() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  IteratorStats st;
  st.rows = s_->rows;
  st.wait_seconds = s_->wait;
  st.producer_busy_seconds = s_->busy;
  st.producer_blocked_seconds = s_->blocked;
  st.elapsed_seconds = seconds(Clock::now() - s_->window_start);
  return st;
}

void Prefetcher::reset_stats() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->rows = 0;
  s_->wait = s_->busy = s_->blocked = 0;
  s_->window_start = Clock::now();
}

}  // namespace demi::data
