// The communication thread: every MPI call of the process runs on it, one job at a time, in the order
// the jobs were submitted (the order of collectives must be the same on every process, and one thread
// keeps it so). A watchdog thread aborts the job when a job has run longer than the timeout.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace demi::dist::internal {

struct Job {
  std::function<void()> run;  // runs on the communication thread; may call MPI
  std::string what;           // for the watchdog's message
  std::atomic<bool> done{false};  // set by the communication thread (or at once when run inline)
  std::exception_ptr error;
};
using JobPtr = std::shared_ptr<Job>;

// Queues `run` on the communication thread (init() must have been called).
JobPtr submit(std::function<void()> run, std::string what);
// Blocks until `job` has run; rethrows what it threw.
void wait(const JobPtr& job);
// submit + wait.
void run_on_comm_thread(std::function<void()> run, std::string what);

// The bf16 all-reduce of `n` FP32 values at `data`, in place, on the communication thread (called from
// a job): each process's values rounded to bfloat16, an all-to-all of equal chunks, each process's chunk
// summed over the processes in FP32 and rounded once, an all-gather of the sums, widened back to FP32.
// The same bytes as a ring all-reduce of bfloat16, with one rounding instead of one per hop.
void all_reduce_bf16_sum(float* data, int64_t n);
// The FP32 all-reduce (MPI_SUM), in place, from a job.
void all_reduce_f32_sum(float* data, int64_t n);

}  // namespace demi::dist::internal
