// Which of a few kernels runs a call, decided once per shape by measurement on this machine and
// remembered: in memory for the process (looked up per call by a packed integer key), and on disk in one
// file per kernel family and CPU model, shared by every process on the machine, so that another process
// (a run resumed from a checkpoint) makes the same choices and computes the same bits.
//
// The file: "<stem>-<cpu>.txt" in $DEMI_CACHE_DIR (else $XDG_CACHE_HOME/demi, else ~/.cache/demi, else
// /tmp/demi-UID), <cpu> the CPU's model name, family and model. Lines "KEY = NAME"; a process tunes under
// an exclusive lock on the file and the first choice written wins; a malformed line (a write cut short) is
// skipped. Where no cache folder can be written, choices live in memory only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "demi/core/memory.h"

namespace demi::kernels::internal {

class ChoiceCache {
 public:
  // A call's packed key (unused slots zero).
  using Key = std::array<int64_t, 32>;

  // stem: the file name's start ("matmul-v2"); names: the candidates' names, index = choice.
  ChoiceCache(std::string stem, std::vector<std::string> names);
  ~ChoiceCache();

  // The choice for `key`: from memory, else from the file (under text(), the file's key for it), else
  // tune() now — under the file's lock, so that concurrent processes agree — and recorded.
  int choose(const Key& key, const std::function<std::string()>& text, const std::function<int()>& tune);

  // The choice for `key` if this process has made or read it already, or else the choice file's entry for
  // text() if it has one (the file read, no tuning): what a call that would hold more memory on an unmade
  // choice asks first (a warm file is a choice made).
  std::optional<int> find(const Key& key, const std::function<std::string()>& text);

  const std::string& name(int choice) const { return names_[static_cast<size_t>(choice)]; }
  // The file in use, or "" when choices are kept in memory only.
  std::string path();
  // Uses another folder from now on ("" = the default) and forgets the in-memory choices (tests).
  void set_dir(const std::string& dir);
  // Forgets the in-memory choices (tests; the file is left as it is).
  void clear();

 private:
  struct State;
  std::string stem_;
  std::vector<std::string> names_;
  std::unique_ptr<State> s_;
};

// Seconds per call of f over `reps` calls (steady clock): what a tuner compares.
double seconds_of(const std::function<void()>& f, int reps = 1);

// The two ways of making a call, run(false) and run(true), timed as a choice compares them: each once to
// warm and to see the memory it holds at its peak beyond what was held before it (the `category`'s, or all
// of it), then five alternating rounds of about a millisecond each, the best kept.
struct TwoWays {
  double seconds[2];
  int64_t held[2];
};
TwoWays time_two_ways(const std::function<void(bool)>& run, std::optional<MemCategory> category);

// How a measured choice weighs memory against time, the same on every CPU: a candidate's time is priced up
// by the share of the call's footprint (`footprint`: the bytes its operands and result occupy as stored)
// that its workspace adds over the lightest candidate's (`extra`: copies, widened operands, chunks of f32
// output, held during the call and freed when it returns), plus `margin` (kernels that hold workspace by
// design must be clearly faster: the choice is timed on a loaded machine too): 1% of time for 1% of
// memory. So a kernel three times as fast is worth a bf16 copy of a Dense's f32 master weight (40% of the
// call's footprint at model C's shapes: oneDNN's AMX kernel where AMX exists), and a path a few percent
// faster is worth no copy, whatever the CPU. The smallest priced time wins.
double priced_seconds(double seconds, int64_t extra, int64_t footprint, double margin);

// "Intel_R_Xeon_R_Processor-6-207": the CPU's brand string with family and model (a VM's generic name
// alone would let different CPUs share one file), as a file-name-safe word.
std::string cpu_file_tag();

}  // namespace demi::kernels::internal
