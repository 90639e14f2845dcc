#include "cache/cache.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "base/process_lifetime.hpp"

namespace gnsilu::cache {

std::string default_user_path() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    return std::string(xdg) + "/gnsilu/cache.sqlite";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.cache/gnsilu/cache.sqlite";
  }
  return "";
}

std::vector<std::string> split_path_list(std::string_view list) {
  std::vector<std::string> paths;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(':', start), list.size());
    if (end > start) paths.emplace_back(list.substr(start, end - start));
    start = end + 1;
  }
  return paths;
}

Settings settings_from_environment() {
  Settings s;
  const char* user = std::getenv("GNSILU_CACHE");
  if (user == nullptr || *user == '\0') s.user_path = default_user_path();
  else if (std::string(user) == "off") s.user_path.clear();
  else s.user_path = user;
  if (const char* shared = std::getenv("GNSILU_CACHE_SHARED"); shared != nullptr) {
    s.shared_paths = split_path_list(shared);
  }
  if (const char* busy = std::getenv("GNSILU_CACHE_BUSY_MS"); busy != nullptr && *busy != '\0') {
    s.busy_timeout_ms = std::max(0, std::atoi(busy));
  }
  return s;
}

LayeredCache::LayeredCache(Settings settings) : settings_(std::move(settings)) {}

void LayeredCache::open_all() {
  std::call_once(opened_, [this] {
    if (!settings_.user_path.empty()) {
      user_ = std::make_unique<Store>(settings_.user_path, Store::Mode::ReadWrite, settings_.busy_timeout_ms);
    }
    for (const auto& p : settings_.shared_paths) {
      shared_.push_back(std::make_unique<Store>(p, Store::Mode::ReadOnly, settings_.busy_timeout_ms));
    }
  });
}

Store* LayeredCache::user() {
  open_all();
  return user_.get();
}

const std::vector<std::unique_ptr<Store>>& LayeredCache::shared() {
  open_all();
  return shared_;
}

std::optional<TuningEntry> LayeredCache::find_tuning(const TuningKey& key) {
  open_all();
  if (user_) {
    if (auto e = user_->find_tuning(key)) return e;
  }
  for (auto& s : shared_) {
    if (auto e = s->find_tuning(key)) return e;
  }
  return std::nullopt;
}

bool LayeredCache::put_tuning(const TuningEntry& entry) {
  open_all();
  return user_ && user_->put_tuning(entry);
}

std::optional<KernelImage> LayeredCache::find_kernel(const KernelKey& key) {
  open_all();
  if (user_) {
    if (auto k = user_->find_kernel(key)) return k;
  }
  for (auto& s : shared_) {
    if (auto k = s->find_kernel(key)) return k;
  }
  return std::nullopt;
}

bool LayeredCache::put_kernel(const KernelKey& key, const KernelImage& image) {
  open_all();
  return user_ && user_->put_kernel(key, image);
}

namespace {
// Used by calls during static destruction (immortal).
struct ProcessSlot {
  std::mutex mutex;
  std::shared_ptr<LayeredCache> cache;
};
ProcessSlot& process_slot() { return detail::immortal<ProcessSlot>(); }
}  // namespace

std::shared_ptr<LayeredCache> process_cache() {
  ProcessSlot& slot = process_slot();
  std::lock_guard lock(slot.mutex);
  if (!slot.cache) slot.cache = std::make_shared<LayeredCache>(settings_from_environment());
  return slot.cache;
}

void configure_process_cache(const Settings& settings) {
  ProcessSlot& slot = process_slot();
  std::lock_guard lock(slot.mutex);
  slot.cache = std::make_shared<LayeredCache>(settings);
}

}  // namespace gnsilu::cache
