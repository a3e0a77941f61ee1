// MPI start-up, the communication thread, the watchdog and the world collectives.
#include "demi/distributed/distributed.h"
#include "demi/core/settings.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/half.h"
#include "demi/distributed/internal/comm.h"

namespace demi::dist {
namespace {

using Clock = std::chrono::steady_clock;

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  DEMI_CHECK(false, "dist: ", call, " failed: ", std::string(text, static_cast<size_t>(len)));
}

double env_timeout(double fallback) {
  const std::optional<std::string> value = env_value("DEMI_DIST_TIMEOUT");
  if (!value) return fallback;
  const char* v = value->c_str();
  char* end = nullptr;
  double t = std::strtod(v, &end);
  DEMI_CHECK(end != v && *end == '\0' && t > 0, "DEMI_DIST_TIMEOUT must be a positive number of seconds, got '", v,
             "'");
  return t;
}

class World {
 public:
  static World& get() {
    static World w;
    return w;
  }

  void init() {
    std::lock_guard<std::mutex> lock(mu_);
    if (initialized_) return;
    DEMI_CHECK(!finalized_, "dist::init: MPI was already released in this process and cannot start again");
    timeout_ = env_timeout(timeout_);  // a bad DEMI_DIST_TIMEOUT is an error before MPI starts
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      DEMI_CHECK(provided >= MPI_THREAD_SERIALIZED, "dist::init: this MPI provides thread level ", provided,
                 ", below MPI_THREAD_SERIALIZED, which demi's communication thread needs");
      owns_mpi_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    stop_ = false;
    worker_ = std::thread([this] { work(); });
    watchdog_ = std::thread([this] { watch(); });
    initialized_ = true;
  }

  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!initialized_) return;
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    watchdog_.join();
    std::lock_guard<std::mutex> lock(mu_);
    initialized_ = false;
    finalized_ = true;
    if (owns_mpi_) MPI_Finalize();
  }

  bool initialized() {
    std::lock_guard<std::mutex> lock(mu_);
    return initialized_;
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  internal::JobPtr submit(std::function<void()> run, std::string what) {
    auto job = std::make_shared<internal::Job>();
    job->run = std::move(run);
    job->what = std::move(what);
    {
      std::lock_guard<std::mutex> lock(mu_);
      DEMI_CHECK(initialized_, "dist: ", job->what, " before dist::init()");
      queue_.push_back(job);
    }
    cv_.notify_all();
    return job;
  }

  void wait(const internal::JobPtr& job) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return job->done.load(); });
    if (job->error) std::rethrow_exception(job->error);
  }

  void set_timeout(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    timeout_ = seconds;
  }

 private:
  void work() {
    for (;;) {
      internal::JobPtr job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        job = queue_.front();
        queue_.pop_front();
        running_ = job;
        running_since_ = Clock::now();
      }
      try {
        job->run();
      } catch (...) {
        job->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        job->done = true;
        running_.reset();
      }
      done_cv_.notify_all();
    }
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      if (!running_) continue;
      double waited = std::chrono::duration<double>(Clock::now() - running_since_).count();
      if (waited <= timeout_) continue;
      const std::string what = running_->what;
      const double timeout = timeout_;
      lock.unlock();
      std::fprintf(stderr,
                   "demi dist: rank %d of %d: %s has waited %.0f s for the other processes (timeout %.0f s, "
                   "DEMI_DIST_TIMEOUT): one of them is stalled or has died; ending the job\n",
                   rank_, size_, what.c_str(), waited, timeout);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
      std::_Exit(3);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<internal::JobPtr> queue_;
  internal::JobPtr running_;
  Clock::time_point running_since_;
  std::thread worker_, watchdog_;
  bool initialized_ = false, finalized_ = false, owns_mpi_ = false, stop_ = false;
  double timeout_ = 300;  // DEMI_DIST_TIMEOUT, when set, is read by init() and set_auto_parallel_context()
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

AutoParallelContext g_context;
std::mutex g_context_mu;

// MPI counts are ints: long buffers go in pieces.
template <class F>
void in_pieces(int64_t n, F&& f) {
  constexpr int64_t kMax = INT_MAX / 2;
  for (int64_t at = 0; at < n; at += kMax) f(at, static_cast<int>(std::min(kMax, n - at)));
}

}  // namespace

namespace internal {

JobPtr submit(std::function<void()> run, std::string what) { return World::get().submit(std::move(run), std::move(what)); }
void wait(const JobPtr& job) {
  if (job->done) {  // ran inline (a world of one), or already finished
    if (job->error) std::rethrow_exception(job->error);
    return;
  }
  World::get().wait(job);
}
void run_on_comm_thread(std::function<void()> run, std::string what) { wait(submit(std::move(run), std::move(what))); }

void all_reduce_f32_sum(float* data, int64_t n) {
  in_pieces(n, [&](int64_t at, int count) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data + at, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  });
}

void all_reduce_bf16_sum(float* data, int64_t n) {
  // The conversions run on this (the communication) thread alone, through the serial kernels: a thread
  // team forked here would fight backward's compute threads for the cores (with 2 processes on 2 cores it
  // made a 1 MiB all-reduce orders of magnitude slower; bench/allreduce_bench times the bf16 scheme).
  const demi::internal::ConvertKernels& k = demi::internal::convert_kernels(cpu_level());
  // Scratch kept between calls (they all run on the communication thread): grown, never zeroed or freed,
  // so a bucket's all-reduce touches no fresh page (per-call buffers made 16 MiB buckets far slower).
  thread_local std::vector<BFloat16> send, recv, mine;
  thread_local std::vector<float> sum, part;
  const auto grow = [](auto& v, int64_t size) {
    if (static_cast<int64_t>(v.size()) < size) v.resize(static_cast<size_t>(size));
  };
  const int64_t p = World::get().initialized() ? World::get().size() : 1;
  if (p == 1 || n == 0) {
    grow(send, n);
    k.f32_to_bf16(data, send.data(), n);
    k.bf16_to_f32(send.data(), data, n);
    return;
  }
  const int64_t chunk = (n + p - 1) / p;
  DEMI_CHECK(chunk <= INT_MAX, "dist: a bf16 bucket of ", n, " values is too long for one all-to-all");
  grow(send, p * chunk);
  grow(recv, p * chunk);
  grow(mine, chunk);
  grow(sum, chunk);
  grow(part, chunk);
  k.f32_to_bf16(data, send.data(), n);
  // The padding past n (the last chunk's tail) is sent but never read back: zero it, so no stale bits
  // travel.
  std::fill(send.begin() + n, send.begin() + p * chunk, BFloat16());
  const int c = static_cast<int>(chunk);
  check_mpi(MPI_Alltoall(send.data(), c, MPI_UINT16_T, recv.data(), c, MPI_UINT16_T, MPI_COMM_WORLD), "MPI_Alltoall");
  // This process's chunk: the sum over the processes in rank order, in FP32, rounded once.
  float* acc = sum.data();
  k.bf16_to_f32(recv.data(), acc, chunk);
  for (int64_t r = 1; r < p; ++r) {
    k.bf16_to_f32(recv.data() + r * chunk, part.data(), chunk);
    const float* add = part.data();
    for (int64_t i = 0; i < chunk; ++i) acc[i] += add[i];
  }
  k.f32_to_bf16(acc, mine.data(), chunk);
  check_mpi(MPI_Allgather(mine.data(), c, MPI_UINT16_T, send.data(), c, MPI_UINT16_T, MPI_COMM_WORLD),
            "MPI_Allgather");
  k.bf16_to_f32(send.data(), data, n);
}

}  // namespace internal

void init() { World::get().init(); }
void release() { World::get().release(); }
bool is_initialized() { return World::get().initialized(); }
int get_rank() { return World::get().rank(); }
int get_group_size() { return World::get().size(); }
int get_local_rank() { return World::get().local_rank(); }
int get_local_group_size() { return World::get().local_size(); }

bool launched_as_group() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::atoi(v) > 1) return true;
  }
  return false;
}

void set_auto_parallel_context(const AutoParallelContext& context) {
  DEMI_CHECK(context.bucket_cap_mb >= 0 && context.first_bucket_mb > 0, "set_auto_parallel_context: bucket sizes must ",
             "be positive (bucket_cap_mb 0: automatic), got bucket_cap_mb ", context.bucket_cap_mb,
             " and first_bucket_mb ", context.first_bucket_mb);
  DEMI_CHECK(context.comm_dtype == DType::kF32 || context.comm_dtype == DType::kBF16,
             "set_auto_parallel_context: comm_dtype must be float32 or bfloat16, got ", dtype_name(context.comm_dtype));
  DEMI_CHECK(context.timeout_seconds > 0, "set_auto_parallel_context: timeout_seconds must be positive, got ",
             context.timeout_seconds);
  const double timeout = env_timeout(context.timeout_seconds);  // checked before anything changes
  std::lock_guard<std::mutex> lock(g_context_mu);
  g_context = context;
  World::get().set_timeout(timeout);
}

const AutoParallelContext& get_auto_parallel_context() {
  std::lock_guard<std::mutex> lock(g_context_mu);
  return g_context;
}

void reset_auto_parallel_context() { set_auto_parallel_context({}); }

bool data_parallel() {
  return is_initialized() && get_group_size() > 1 && get_auto_parallel_context().parallel_mode == ParallelMode::kDataParallel;
}

namespace {
// One small in-place MPI_Allreduce on the communication thread (a world of one: nothing to do).
void small_all_reduce(void* values, size_t count, MPI_Datatype type, MPI_Op op, const char* what) {
  if (!is_initialized() || get_group_size() == 1) return;
  internal::run_on_comm_thread(
      [&] {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(count), type, op, MPI_COMM_WORLD),
                  "MPI_Allreduce");
      },
      what);
}
}  // namespace

void all_reduce_sum(std::span<double> values, const char* what) {
  small_all_reduce(values.data(), values.size(), MPI_DOUBLE, MPI_SUM, what);
}

void all_reduce_sum(std::span<float> values, const char* what) {
  if (!is_initialized() || get_group_size() == 1) return;
  internal::run_on_comm_thread([&] { internal::all_reduce_f32_sum(values.data(), static_cast<int64_t>(values.size())); },
                               what);
}

void all_reduce_max(std::span<int64_t> values, const char* what) {
  small_all_reduce(values.data(), values.size(), MPI_INT64_T, MPI_MAX, what);
}

void check_same_settings(const std::vector<std::pair<std::string, std::string>>& settings) {
  if (!is_initialized() || get_group_size() == 1) return;
  // The count first (a fixed-size all-reduce), so that the per-setting one has one size on every process.
  const auto n = static_cast<int64_t>(settings.size());
  int64_t count[2] = {n, -n};
  all_reduce_max(std::span<int64_t>(count, 2), "the all-reduce comparing the processes' settings");
  DEMI_CHECK(count[0] == -count[1], "data parallel: the processes compare between ", -count[1], " and ", count[0],
             " settings (this is rank ", get_rank(), " with ", n, "): run the same demi on every process");
  std::vector<int64_t> v(static_cast<size_t>(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = 1469598103934665603ull;
    for (char c : str_cat(settings[static_cast<size_t>(i)].first, "=", settings[static_cast<size_t>(i)].second))
      h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    v[static_cast<size_t>(i)] = static_cast<int64_t>(h >> 1);
    v[static_cast<size_t>(n + i)] = -static_cast<int64_t>(h >> 1);
  }
  all_reduce_max(std::span<int64_t>(v), "the all-reduce comparing the processes' settings");
  std::string differ;
  for (int64_t i = 0; i < n; ++i)
    if (v[static_cast<size_t>(i)] != -v[static_cast<size_t>(n + i)]) {
      const auto& [name, value] = settings[static_cast<size_t>(i)];
      differ += str_cat(differ.empty() ? "" : ", ", name, " (here '", value, "')");
    }
  DEMI_CHECK(differ.empty(), "data parallel: the processes disagree on ", differ, "; this is rank ", get_rank(),
             ". Every process of one job must train with the same settings: give them the same options");
}

void broadcast(void* data, size_t bytes, int root, const char* what) {
  if (!is_initialized() || get_group_size() == 1) return;
  DEMI_CHECK(root >= 0 && root < get_group_size(), "dist::broadcast: root ", root, " is not a rank of this world of ",
             get_group_size());
  internal::run_on_comm_thread(
      [&] {
        in_pieces(static_cast<int64_t>(bytes), [&](int64_t at, int count) {
          check_mpi(MPI_Bcast(static_cast<char*>(data) + at, count, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
        });
      },
      what);
}

void barrier(const char* what) {
  if (!is_initialized() || get_group_size() == 1) return;
  internal::run_on_comm_thread([] { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }, what);
}

void abort(const std::string& message, int exit_code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (up && !down && get_group_size() > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace demi::dist
