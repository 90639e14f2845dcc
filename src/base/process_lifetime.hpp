// Process-wide objects, and values computed once per key while other threads wait. The two idioms every layer
// uses for its process state (the module registry, the workspaces, the configuration table, the counters, the
// process cache, the logger), written once.
#pragma once

#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <utility>

namespace gnsilu::detail {

// The one object of type T for the process, built on first use (thread-safe) and never destroyed: calls may come
// from other threads and exit handlers during static destruction, and objects holding driver handles must not
// be torn down after the driver is gone. Each caller names its own T, so each T has one instance.
template <class T>
T& immortal() {
  static T* const instance = new T();
  return *instance;
}

// The same, built by `make` (a lambda: one instance per call site), which returns a new T.
template <class T, class Make>
T& immortal(Make make) {
  static T* const instance = make();
  return *instance;
}

// Values by key, each computed once: the first thread to ask computes (outside the lock), the others asking for
// the same key meanwhile wait for it and get the same value, or the same exception. A computation that throws
// or says not to keep its value leaves nothing behind: a later call computes again.
template <class Key, class Value, class Hash = std::hash<Key>>
class ComputeOnce {
 public:
  struct Computed {
    Value value;
    bool keep = true;  // false: give the value to this call and its waiters only
  };

  // The kept value for `key`, if there is one (a shared lock: the hot path).
  std::optional<Value> find(const Key& key) const {
    std::shared_lock lock(mutex_);
    auto it = done_.find(key);
    if (it == done_.end()) return std::nullopt;
    return it->second;
  }

  // The value for `key`: kept, in flight in another thread (waited for), or computed by `compute()` here, which
  // returns a Computed.
  template <class Compute>
  Value get(const Key& key, Compute&& compute) {
    std::promise<Value> promise;
    std::shared_future<Value> future;
    bool mine = false;
    {
      std::unique_lock lock(mutex_);
      if (auto it = done_.find(key); it != done_.end()) return it->second;
      if (auto it = in_flight_.find(key); it != in_flight_.end()) {
        future = it->second;
      } else {
        future = promise.get_future().share();
        in_flight_.emplace(key, future);
        mine = true;
      }
    }
    if (!mine) return future.get();  // another thread of this process is computing it
    try {
      Computed result = compute();
      {
        std::unique_lock lock(mutex_);
        if (result.keep) done_.insert_or_assign(key, result.value);
        in_flight_.erase(key);
      }
      promise.set_value(result.value);
      return std::move(result.value);
    } catch (...) {
      {
        std::unique_lock lock(mutex_);
        in_flight_.erase(key);
      }
      promise.set_exception(std::current_exception());
      throw;
    }
  }

  // Forgets every kept value (computations in flight finish and are kept).
  void clear() {
    std::unique_lock lock(mutex_);
    done_.clear();
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<Key, Value, Hash> done_;
  std::unordered_map<Key, std::shared_future<Value>, Hash> in_flight_;
};

}  // namespace gnsilu::detail
