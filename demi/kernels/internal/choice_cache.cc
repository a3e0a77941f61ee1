#include "demi/kernels/internal/choice_cache.h"
#include "demi/core/files.h"
#include "demi/core/settings.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"

namespace demi::kernels::internal {
namespace {

struct KeyHash {
  size_t operator()(const ChoiceCache::Key& k) const {
    size_t h = 0;
    for (int64_t x : k) h = h * 0x9E3779B97F4A7C15ull + std::hash<int64_t>()(x);
    return h;
  }
};

}  // namespace

double priced_seconds(double seconds, int64_t extra, int64_t footprint, double margin) {
  const double share = extra > 0 ? static_cast<double>(extra) / static_cast<double>(std::max<int64_t>(footprint, 1)) : 0;
  return seconds * (1 + margin + share);
}

double seconds_of(const std::function<void()>& f, int reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

TwoWays time_two_ways(const std::function<void(bool)>& run, std::optional<MemCategory> category) {
  TwoWays t{{1e30, 1e30}, {0, 0}};
  double warm = 0;
  for (int i = 0; i < 2; ++i) {
    const MemStats now = mem_stats();
    const int64_t before = category ? now.cur(*category) : now.total_current;
    ScopedPeak peak;
    warm += seconds_of([&] { run(i == 1); });
    const MemStats held = peak.peak();
    t.held[i] = (category ? held.pk(*category) : held.total_peak) - before;
  }
  const int reps = std::clamp(static_cast<int>(2e-3 / std::max(warm, 1e-9)), 1, 20);
  for (int r = 0; r < 5; ++r)
    for (int i = 0; i < 2; ++i) t.seconds[i] = std::min(t.seconds[i], seconds_of([&] { run(i == 1); }, reps));
  return t;
}

std::string cpu_file_tag() {
  const CpuId& id = cpu_id();
  std::string name;
  for (char ch : id.name)
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.') name += ch;
    else if (!name.empty() && name.back() != '_') name += '_';
  while (!name.empty() && name.back() == '_') name.pop_back();
  return str_cat(name, "-", id.family, "-", id.model);
}

struct ChoiceCache::State {
  std::mutex mu;
  std::unordered_map<Key, int, KeyHash> fast;  // what this process has decided
  std::unordered_map<std::string, int> map;    // by the file's text keys (merged from the file)
  std::string dir;                             // set_dir's, or "" for the default
  std::string path;                            // "" = memory only
  bool path_checked = false;
};

ChoiceCache::ChoiceCache(std::string stem, std::vector<std::string> names)
    : stem_(std::move(stem)), names_(std::move(names)), s_(std::make_unique<State>()) {}
ChoiceCache::~ChoiceCache() = default;

namespace {

// A choice file holds a line per product shape a process met: tens of KiB. Far beyond that it is not one.
constexpr off_t kMaxCacheBytes = off_t{16} << 20;

// The cache file, created (with its folder) on first use; "" if that is not possible.
const std::string& cache_path(const std::string& stem, bool& checked, std::string& path, const std::string& dir_in) {
  if (!checked) {
    checked = true;
    const std::string dir = dir_in.empty() ? cache_dir() : dir_in;
    std::error_code ec;
    if (!dir.empty() && (std::filesystem::create_directories(dir, ec), std::filesystem::is_directory(dir, ec))) {
      const std::string p = str_cat(dir, "/", stem, "-", cpu_file_tag(), ".txt");
      // (O_NONBLOCK: a FIFO in its place is never waited on.) A file that is not what a choice file is — not
      // a regular file (it once read /dev/zero until out of memory), or far larger than any — is said once
      // and not used as it is: a huge one is started anew, anything else leaves the choices in memory.
      const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
      struct stat st {};
      if (fd >= 0 && ::fstat(fd, &st) == 0) {
        if (!S_ISREG(st.st_mode)) {
          std::fprintf(stderr, "demi: warning: the kernel-choice cache %s is not a regular file: this process keeps "
                       "its choices in memory only\n", p.c_str());
        } else {
          if (st.st_size > kMaxCacheBytes) {
            std::fprintf(stderr, "demi: warning: the kernel-choice cache %s holds %lld bytes, more than a choice "
                         "file ever does: it is started anew\n", p.c_str(), static_cast<long long>(st.st_size));
            [[maybe_unused]] int t = ::ftruncate(fd, 0);
          }
          path = p;
        }
      }
      if (fd >= 0) ::close(fd);
    }
  }
  return path;
}

// The choice file's lines `text = name` (a name of `names`) merged into `map` (entries there stay).
void merge_file(int fd, const std::vector<std::string>& names, std::unordered_map<std::string, int>& map) {
  std::string all;
  char buf[4096];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) all.append(buf, static_cast<size_t>(n));
  std::istringstream in(all);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.rfind(" = ");
    if (eq == std::string::npos) continue;
    const std::string value = line.substr(eq + 3);
    for (size_t i = 0; i < names.size(); ++i)
      if (value == names[i]) map.emplace(line.substr(0, eq), static_cast<int>(i));
  }
}

struct File {  // closed (and so unlocked) however the function that opened it is left
  int fd;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

int ChoiceCache::choose(const Key& key, const std::function<std::string()>& text, const std::function<int()>& tune) {
  State& c = *s_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto it = c.fast.find(key); it != c.fast.end()) return it->second;
  const std::string tkey = text();
  if (auto it = c.map.find(tkey); it != c.map.end()) return c.fast[key] = it->second;
  const std::string& path = cache_path(stem_, c.path_checked, c.path, c.dir);
  const File file{path.empty() ? -1 : ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC)};
  const int fd = file.fd;
  if (fd >= 0 && ::flock(fd, LOCK_EX) == 0) merge_file(fd, names_, c.map);  // (entries in memory stay)
  int k;
  if (auto it = c.map.find(tkey); it != c.map.end()) {
    k = it->second;
  } else {
    {
      MemTuningScope trials;  // a shape's first call: its trial runs count in no training peak
      k = tune();
    }
    DEMI_ASSERT(k >= 0 && static_cast<size_t>(k) < names_.size(), "a tuner chose ", k, " of ", names_.size());
    c.map.emplace(tkey, k);
    if (fd >= 0) {
      const std::string line = str_cat(tkey, " = ", names_[static_cast<size_t>(k)], "\n");
      [[maybe_unused]] ssize_t w = ::write(fd, line.data(), line.size());  // one short append: all or nothing
    }
  }
  c.fast[key] = k;
  return k;
}

std::optional<int> ChoiceCache::find(const Key& key, const std::function<std::string()>& text) {
  State& c = *s_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto it = c.fast.find(key); it != c.fast.end()) return it->second;
  const std::string tkey = text();
  if (c.map.find(tkey) == c.map.end()) {
    const std::string& path = cache_path(stem_, c.path_checked, c.path, c.dir);
    const File file{path.empty() ? -1 : ::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (file.fd >= 0 && ::flock(file.fd, LOCK_SH) == 0) merge_file(file.fd, names_, c.map);
  }
  if (auto it = c.map.find(tkey); it != c.map.end()) return c.fast[key] = it->second;
  return std::nullopt;
}

std::string ChoiceCache::path() {
  std::lock_guard<std::mutex> lock(s_->mu);
  return cache_path(stem_, s_->path_checked, s_->path, s_->dir);
}

void ChoiceCache::set_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->dir = dir;
  s_->path.clear();
  s_->path_checked = false;
  s_->map.clear();
  s_->fast.clear();
}

void ChoiceCache::clear() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->map.clear();
  s_->fast.clear();
}

}  // namespace demi::kernels::internal
