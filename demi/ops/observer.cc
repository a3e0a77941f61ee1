#include "demi/ops/observer.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

namespace demi::ops {
namespace {

thread_local std::vector<OpObserver*> t_observers;
thread_local bool t_notifying = false;  // an observer is running: its own ops are not observed
thread_local const char* t_layer = nullptr;
thread_local bool t_fusion = true;

// Global observers: a copy-on-write list, so notifying reads it without a lock.
std::mutex g_global_mutex;
std::shared_ptr<const std::vector<OpObserver*>> g_global;
std::atomic<int> g_global_count{0};
std::atomic<int> g_global_timing{0};

std::shared_ptr<const std::vector<OpObserver*>> global_list() {
  std::lock_guard<std::mutex> lock(g_global_mutex);
  return g_global;
}

}  // namespace

OpObserverScope::OpObserverScope(OpObserver* observer) : observer_(observer) {
  if (observer_ != nullptr) t_observers.push_back(observer_);
}
OpObserverScope::~OpObserverScope() {
  if (observer_ == nullptr) return;
  auto it = std::find(t_observers.rbegin(), t_observers.rend(), observer_);
  if (it != t_observers.rend()) t_observers.erase(std::next(it).base());
}

ObserverIsolationScope::ObserverIsolationScope() : saved_(std::move(t_observers)) { t_observers.clear(); }
ObserverIsolationScope::~ObserverIsolationScope() { t_observers = std::move(saved_); }

void add_global_observer(OpObserver* observer) {
  std::lock_guard<std::mutex> lock(g_global_mutex);
  auto next = std::make_shared<std::vector<OpObserver*>>(g_global ? *g_global : std::vector<OpObserver*>{});
  if (std::find(next->begin(), next->end(), observer) != next->end()) return;
  next->push_back(observer);
  g_global = std::move(next);
  g_global_count.fetch_add(1);
  if (observer->wants_timing()) g_global_timing.fetch_add(1);
}

void remove_global_observer(OpObserver* observer) {
  std::lock_guard<std::mutex> lock(g_global_mutex);
  if (!g_global) return;
  auto next = std::make_shared<std::vector<OpObserver*>>(*g_global);
  auto it = std::find(next->begin(), next->end(), observer);
  if (it == next->end()) return;
  next->erase(it);
  g_global = std::move(next);
  g_global_count.fetch_sub(1);
  if (observer->wants_timing()) g_global_timing.fetch_sub(1);
}

bool observing() {
  if (t_notifying) return false;
  return !t_observers.empty() || g_global_count.load(std::memory_order_relaxed) > 0;
}

bool timing_wanted() {
  if (t_notifying) return false;
  if (g_global_timing.load(std::memory_order_relaxed) > 0) return true;
  for (const OpObserver* o : t_observers)
    if (o->wants_timing()) return true;
  return false;
}

void notify(const OpEvent& event) {
  if (t_notifying) return;
  struct Guard {
    Guard() { t_notifying = true; }
    ~Guard() { t_notifying = false; }
  } guard;
  // A copy: an observer may install or remove observers while it runs.
  if (!t_observers.empty()) {
    std::vector<OpObserver*> local = t_observers;
    for (OpObserver* o : local) o->on_op(event);
  }
  if (g_global_count.load(std::memory_order_relaxed) > 0) {
    auto global = global_list();
    if (global)
      for (OpObserver* o : *global) o->on_op(event);
  }
}

LayerScope::LayerScope(const char* layer) : saved_(t_layer) { t_layer = layer; }
LayerScope::~LayerScope() { t_layer = saved_; }
const char* current_layer() { return t_layer; }

const char* intern_layer_path(std::string_view path) {
  static std::mutex mutex;
  static auto* paths = new std::unordered_set<std::string>();  // never freed: pointers live forever
  std::lock_guard<std::mutex> lock(mutex);
  return paths->emplace(path).first->c_str();
}

bool layer_within(std::string_view layer, std::string_view path) {
  if (path.empty() || layer == path) return true;
  return layer.size() > path.size() && layer.compare(0, path.size(), path) == 0 && layer[path.size()] == '.';
}

FusionScope::FusionScope(bool enabled) : saved_(t_fusion) { t_fusion = enabled; }
FusionScope::~FusionScope() { t_fusion = saved_; }
bool fusion_enabled() { return t_fusion; }

}  // namespace demi::ops
