#include "demi/kernels/matmul.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/gemm.h"
#include "demi/kernels/cpu/internal/workspace.h"
#include "demi/kernels/onednn/matmul.h"
#include "demi/kernels/reference/matmul.h"

namespace demi::kernels {
namespace {

enum class Kernel : uint8_t { kOnednn, kDemiF32, kDemiBf16 };

// Part of the cache file's name: bumped when the kernels or the tuning change enough that choices made
// before should be made again.
constexpr int kTuneVersion = 2;
constexpr const char* kKernelNames[] = {"onednn", "demi-f32", "demi-bf16"};

bool parse_kernel(const std::string& s, Kernel* k) {
  for (int i = 0; i < 3; ++i)
    if (s == kKernelNames[i]) {
      *k = static_cast<Kernel>(i);
      return true;
    }
  return false;
}

MatmulPolicy policy_from_env() {
  const char* s = std::getenv("DEMI_MATMUL");
  if (s == nullptr || std::strcmp(s, "auto") == 0 || *s == '\0') return MatmulPolicy::kAuto;
  if (std::strcmp(s, "demi") == 0) return MatmulPolicy::kDemi;
  if (std::strcmp(s, "onednn") == 0) return MatmulPolicy::kOnednn;
  DEMI_CHECK(false, "DEMI_MATMUL must be auto, demi or onednn, got \"", s, "\"");
  return MatmulPolicy::kAuto;
}

std::atomic<MatmulPolicy>& policy_slot() {
  static std::atomic<MatmulPolicy> p{policy_from_env()};
  return p;
}

// What decides the fastest kernel: the product's sizes, layout, dtypes and epilogue, where it runs, and
// whether oneDNN is a candidate. Packed into integers for the lookup every call makes; the text form
// (key_of, the cache file's) is built only when a product is not in memory yet.
struct Key {
  std::array<int64_t, 5> v;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    for (int64_t x : k.v) h = h * 0x9E3779B97F4A7C15ull + std::hash<int64_t>()(x);
    return h;
  }
};

Key key_of_params(const MatmulParams& p) {
  const int64_t flags = static_cast<int64_t>(cpu_level()) | int64_t{num_threads()} << 8 |
                        int64_t{p.trans_a} << 24 | int64_t{p.trans_b} << 25 | int64_t{p.bias != nullptr} << 26 |
                        int64_t{p.relu} << 27 | int64_t{p.accumulate} << 28 |
                        int64_t{matmul_policy() == MatmulPolicy::kDemi} << 29 |
                        static_cast<int64_t>(p.a_dtype) << 32 | static_cast<int64_t>(p.b_dtype) << 40 |
                        static_cast<int64_t>(p.c_dtype) << 48;
  return {{p.batch, p.m, p.n, p.k, flags}};
}

std::string key_of(const MatmulParams& p) {
  return str_cat(cpu_level_name(cpu_level()), " t", num_threads(), " b", p.batch, " ", p.m, "x", p.n, "x", p.k,
                 p.trans_a ? " ta" : " a", p.trans_b ? " tb" : " b", " ", dtype_name(p.a_dtype), ",",
                 dtype_name(p.b_dtype), "->", dtype_name(p.c_dtype), p.bias ? " bias" : "", p.relu ? " relu" : "",
                 p.accumulate ? " acc" : "");
}

// "Intel_R_Xeon_R_Processor-6-207": the brand string with family and model (a VM's generic name alone
// would let different CPUs share one file), as a file-name-safe word.
std::string cpu_file_tag() {
  const CpuId& id = cpu_id();
  std::string name;
  for (char ch : id.name)
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.') name += ch;
    else if (!name.empty() && name.back() != '_') name += '_';
  while (!name.empty() && name.back() == '_') name.pop_back();
  return str_cat(name, "-", id.family, "-", id.model);
}

std::string default_cache_dir() {
  if (const char* d = std::getenv("DEMI_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/demi";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/demi";
  return str_cat("/tmp/demi-", ::getuid());
}

struct Choices {
  std::mutex mu;
  std::unordered_map<Key, Kernel, KeyHash> fast;  // what this process has decided
  std::unordered_map<std::string, Kernel> map;     // by the cache file's text keys (merged from the file)
  std::string dir;   // set_matmul_cache_dir's, or "" for the default
  std::string path;  // "" = memory only
  bool path_checked = false;
};

Choices& choices() {
  static auto& c = *new Choices;  // never destroyed: used until the process ends
  return c;
}

// The cache file, created (with its folder) on first use; "" if that is not possible.
const std::string& cache_path(Choices& c) {
  if (!c.path_checked) {
    c.path_checked = true;
    const std::string dir = c.dir.empty() ? default_cache_dir() : c.dir;
    std::error_code ec;
    if (!dir.empty() && (std::filesystem::create_directories(dir, ec), std::filesystem::is_directory(dir, ec))) {
      const std::string path = str_cat(dir, "/matmul-v", kTuneVersion, "-", cpu_file_tag(), ".txt");
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::close(fd);
        c.path = path;
      }
    }
  }
  return c.path;
}

// Lines "KEY = KERNEL"; a malformed line (a write cut short) is skipped. Entries already in memory stay.
void merge_file(Choices& c, int fd) {
  std::string text;
  char buf[4096];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.rfind(" = ");
    Kernel k;
    if (eq == std::string::npos || !parse_kernel(line.substr(eq + 3), &k)) continue;
    c.map.emplace(line.substr(0, eq), k);
  }
}

constexpr double kF16WidenMargin = 1.1;

// Seconds per call of f, over `reps` calls.
double seconds_of(const std::function<void()>& f, int reps = 1) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

void run(Kernel k, const MatmulParams& p, const void* a, const void* b, void* c) {
  switch (k) {
    case Kernel::kOnednn: return onednn::matmul(p, a, b, c);
    case Kernel::kDemiF32: return cpu::gemm(p, a, b, c, cpu::GemmPath::kF32);
    case Kernel::kDemiBf16: return cpu::gemm(p, a, b, c, cpu::GemmPath::kBf16Dot);
  }
}

// Each candidate once to warm up (oneDNN creates its primitive), then rounds that alternate between them;
// the best time of each decides.
// a or b null (a diagnostic without operands): the candidates run on zeroed scratch operands instead.
Kernel tune(const MatmulParams& p_in, const void* a, const void* b, void* c) {
  MatmulParams p = p_in;
  const bool scratch_in = a == nullptr || b == nullptr;
  const size_t a_bytes = static_cast<size_t>(p.batch * p.m * p.k) * dtype_size(p.a_dtype);
  const size_t b_bytes = static_cast<size_t>(p.batch * p.k * p.n) * dtype_size(p.b_dtype);
  const size_t bias_bytes = static_cast<size_t>(p.n) * dtype_size(p.bias_dtype);
  cpu_internal::Workspace sa(scratch_in ? a_bytes : 0), sb(scratch_in ? b_bytes : 0),
      sbias(scratch_in && p.bias ? bias_bytes : 0);
  if (scratch_in) {
    std::memset(sa.f32(), 0, a_bytes);
    std::memset(sb.f32(), 0, b_bytes);
    a = sa.f32();
    b = sb.f32();
    if (p.bias) {
      std::memset(sbias.f32(), 0, bias_bytes);
      p.bias = sbias.f32();
    }
  }
  std::vector<Kernel> cand;
  if (matmul_policy() != MatmulPolicy::kDemi) cand.push_back(Kernel::kOnednn);
  cand.push_back(Kernel::kDemiF32);
  if (p.a_dtype == DType::kBF16 && p.b_dtype == DType::kBF16 && cpu::gemm_has_bf16_dot())
    cand.push_back(Kernel::kDemiBf16);
  if (cand.size() == 1) return cand[0];
  // Output: c itself unless the product reads it (accumulate): the chosen kernel's run overwrites it after.
  const size_t c_bytes = static_cast<size_t>(p.batch * p.m * p.n) * dtype_size(p.c_dtype);
  cpu_internal::Workspace scratch(p.accumulate || c == nullptr ? c_bytes : 0);
  void* out = p.accumulate || c == nullptr ? static_cast<void*>(scratch.f32()) : c;
  if (out != c) std::memset(out, 0, c_bytes);
  std::vector<double> best(cand.size(), 1e30);
  double total = 0;
  for (size_t i = 0; i < cand.size(); ++i) total += seconds_of([&] { run(cand[i], p, a, b, out); });
  // Each measurement repeats a small product to ~0.5 ms (one call of a tiny product is all noise); about 3
  // rounds, fewer for products that take long (the tuning stays under ~0.2 s per shape).
  const double per_call = total / static_cast<double>(cand.size());
  const int reps = std::clamp(static_cast<int>(5e-4 / std::max(per_call, 1e-9)), 1, 200);
  const int rounds = std::clamp(static_cast<int>(0.2 / std::max(total * reps, 1e-9)), 1, 3);
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < cand.size(); ++i)
      best[i] = std::min(best[i], seconds_of([&] { run(cand[i], p, a, b, out); }, reps));
  // oneDNN's f16 path widens whole operands into f32 workspace (demi's converts panel by panel): it has to
  // be clearly faster, by kF16WidenMargin, to be worth that memory.
  const bool f16 = p.a_dtype == DType::kF16 || p.b_dtype == DType::kF16;
  if (f16 && cand[0] == Kernel::kOnednn) best[0] *= kF16WidenMargin;
  return cand[static_cast<size_t>(std::min_element(best.begin(), best.end()) - best.begin())];
}

// The kernel for p: from memory, else from the cache file, else tuned now (under the file's lock, so that
// concurrent processes agree) and recorded.
Kernel choose(const MatmulParams& p, const void* a, const void* b, void* out) {
  if (matmul_policy() == MatmulPolicy::kOnednn) return Kernel::kOnednn;
  Choices& c = choices();
  const Key fast_key = key_of_params(p);
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto it = c.fast.find(fast_key); it != c.fast.end()) return it->second;
  const std::string key = str_cat(matmul_policy() == MatmulPolicy::kDemi ? "demi-only " : "", key_of(p));
  if (auto it = c.map.find(key); it != c.map.end()) return c.fast[fast_key] = it->second;
  const std::string& path = cache_path(c);
  struct File {  // closed (and so unlocked) however this function is left
    int fd;
    ~File() {
      if (fd >= 0) ::close(fd);
    }
  } file{path.empty() ? -1 : ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC)};
  const int fd = file.fd;
  if (fd >= 0 && ::flock(fd, LOCK_EX) == 0) merge_file(c, fd);
  Kernel k;
  if (auto it = c.map.find(key); it != c.map.end()) {
    k = it->second;
  } else {
    k = tune(p, a, b, out);
    c.map.emplace(key, k);
    if (fd >= 0) {
      const std::string line = str_cat(key, " = ", kKernelNames[static_cast<int>(k)], "\n");
      [[maybe_unused]] ssize_t w = ::write(fd, line.data(), line.size());  // one short append: all or nothing
    }
  }
  c.fast[fast_key] = k;
  return k;
}

}  // namespace

void set_matmul_policy(MatmulPolicy policy) { policy_slot().store(policy); }
MatmulPolicy matmul_policy() { return policy_slot().load(); }

void matmul(const MatmulParams& p, const void* a, const void* b, void* c) {
  check_matmul_params(p, "matmul");
  if (p.c_dtype == DType::kF64) return ref::matmul(p, a, b, c);
  run(choose(p, a, b, c), p, a, b, c);
}

bool matmul_picks_onednn(const MatmulParams& p, const void* a, const void* b) {
  check_matmul_params(p, "matmul");
  return p.c_dtype != DType::kF64 && choose(p, a, b, nullptr) == Kernel::kOnednn;
}

std::string matmul_kernel(const MatmulParams& p) {
  check_matmul_params(p, "matmul");
  if (p.c_dtype == DType::kF64) return "reference";
  const Kernel k = choose(p, nullptr, nullptr, nullptr);
  const std::string impl = k == Kernel::kOnednn ? onednn::matmul_implementation(p)
                                                : cpu::gemm_implementation(p, k == Kernel::kDemiBf16
                                                                                  ? cpu::GemmPath::kBf16Dot
                                                                                  : cpu::GemmPath::kF32);
  return str_cat(kKernelNames[static_cast<int>(k)], " (", impl, ")");
}

std::string matmul_cache_path() {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mu);
  return cache_path(c);
}

void set_matmul_cache_dir(const std::string& dir) {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mu);
  c.dir = dir;
  c.path.clear();
  c.path_checked = false;
  c.map.clear();
  c.fast.clear();
}

void clear_matmul_choices() {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mu);
  c.map.clear();
  c.fast.clear();
}

}  // namespace demi::kernels
