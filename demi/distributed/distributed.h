// Processes that train together, on MPI (OpenMPI from Debian; MPICH builds too: only MPI-3.1 is used).
// MindSpore's names:
//
//   dist::init();                                     // every process launched by mpirun / srun
//   dist::set_auto_parallel_context({.parallel_mode = dist::ParallelMode::kDataParallel});
//   train::Model model(net, loss, opt, metrics, options);   // now trains data-parallel
//   model.train(epochs, ds);                          // ds sharded per process: each sample once per epoch
//   if (dist::get_rank() == 0) ...                    // print, write files
//   dist::release();
//
// A process started alone (no launcher) that calls init() is a world of one; a program that never calls
// init() never starts MPI. The `demi` command calls init() itself when mpirun or srun launched it.
//
// Every MPI call runs on one communication thread that this module owns (MPI_THREAD_SERIALIZED is all
// it needs): the collectives below hand it their work and wait, and data parallelism's gradient buckets
// are reduced there while backward goes on. A watchdog aborts the whole job, with a message naming the
// collective and this rank, when one has waited longer than the context's timeout_seconds: a stalled or
// dead process never hangs the others. (A process that dies is noticed sooner by mpirun itself, which
// ends the job within seconds and names the rank.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>
#include <utility>
#include <string>

#include "demi/core/dtype.h"

namespace demi::dist {

// Starts MPI (idempotent). After release() a process cannot init() again (MPI's rule).
void init();
// Stops the communication thread and finalizes MPI; idempotent, a no-op when init() was never called.
void release();
bool is_initialized();
// This process's rank in the world and the world's size (0 and 1 before init()).
int get_rank();
int get_group_size();
// The rank among the processes on this machine, and how many run here (0 and 1 before init()).
int get_local_rank();
int get_local_group_size();
// True when a launcher started this process as one of several (mpirun, srun, any PMI/PMIx launcher):
// the `demi` command then calls init() itself.
bool launched_as_group();

enum class ParallelMode { kStandAlone, kDataParallel };

// MindSpore's set_auto_parallel_context, for data parallelism. Where MindSpore's default differs it is
// said: gradients_mean defaults to true here (MindSpore sums), because the mean is what makes N
// processes with batch b equal one process with batch N·b.
struct AutoParallelContext {
  ParallelMode parallel_mode = ParallelMode::kStandAlone;
  // Combined gradient = the mean over the processes' samples (each process's gradient weighted by its
  // batch's share of the global batch); false: the plain sum.
  bool gradients_mean = true;
  // Parameters and buffers copied from rank 0 when training starts, so every process starts equal.
  bool parameter_broadcast = true;
  // Gradients travel in flat buckets of at most bucket_cap_mb MiB (in reverse registration order, the
  // order backward makes them), the first one of first_bucket_mb so the reduction starts early. 0: a
  // quarter of the model's gradient bytes, within [1, 25] MiB (25 MiB is PyTorch DDP's cap; a model of a
  // few MiB then still gets several buckets, so most of its all-reduce runs while backward goes on).
  double bucket_cap_mb = 0;
  double first_bucket_mb = 1;
  // What gradients travel as: kF32 (exact sums), or kBF16 (half the bytes; each process's share summed
  // in FP32 and rounded to bfloat16 once, never once per hop).
  DType comm_dtype = DType::kF32;
  // Reduce each bucket as soon as backward completes it, while backward goes on (false: all after
  // backward, for debugging).
  bool overlap = true;
  // A collective waiting longer than this aborts the job (also DEMI_DIST_TIMEOUT=seconds).
  double timeout_seconds = 300;
};
void set_auto_parallel_context(const AutoParallelContext& context);
const AutoParallelContext& get_auto_parallel_context();
void reset_auto_parallel_context();
// Data parallelism is on: init() was called, the world has more than one process, and the context's
// mode is kDataParallel.
bool data_parallel();

// Collectives over the whole world. Blocking; call them in the same order on every process. `what`
// names the collective in the watchdog's message.
void all_reduce_sum(std::span<double> values, const char* what = "all-reduce");
void all_reduce_sum(std::span<float> values, const char* what = "all-reduce");
// The element-wise maximum (a flag any process raised).
void all_reduce_max(std::span<int64_t> values, const char* what = "all-reduce");
// Every process must run with the same settings (name, value): compared at start-up by a hash of each,
// one all-reduce of maxima and negated minima, so that every process sees the same answer. A setting that
// differs is a demi::Error on every process naming the setting, this process's rank and its value (a
// different --seed, --lr or --batch-size per rank once trained to the end, silently). A no-op on one process.
void check_same_settings(const std::vector<std::pair<std::string, std::string>>& settings);
// `bytes` bytes at `data` copied from rank `root` to every process.
void broadcast(void* data, size_t bytes, int root = 0, const char* what = "broadcast");
void barrier(const char* what = "barrier");
// Prints `message` on this process's standard error and ends every process of the job (MPI_Abort);
// without MPI, ends this process. Use it when an error on one process would leave the others waiting.
[[noreturn]] void abort(const std::string& message, int exit_code = 1);

}  // namespace demi::dist
