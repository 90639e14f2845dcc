// The layered cache a process uses: the user's writable file on top, read-only shared files below it (a
// fleet image, a read-only mount). Lookups try the user file first, then the shared files in order; results
// are written to the user file only. Settings come from the environment unless the API sets them.
//
//   GNSILU_CACHE          the user file (default: $XDG_CACHE_HOME/gnsilu/cache.sqlite, else
//                         ~/.cache/gnsilu/cache.sqlite); "off" keeps everything in memory
//   GNSILU_CACHE_SHARED   read-only files, separated by ':'
//   GNSILU_CACHE_BUSY_MS  how long to wait for a lock held by another process (default 5000)
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/entries.hpp"
#include "cache/store.hpp"

namespace gnsilu::cache {

struct Settings {
  std::string user_path;                  // "" : no persistent user file
  std::vector<std::string> shared_paths;
  int busy_timeout_ms = 5000;
};

Settings settings_from_environment();
// The files of a shared-path list ("a:b:c", as GNSILU_CACHE_SHARED and gnsilu_set_cache_paths take it), empty
// entries dropped.
std::vector<std::string> split_path_list(std::string_view list);
std::string default_user_path();

class LayeredCache {
 public:
  explicit LayeredCache(Settings settings);
  const Settings& settings() const { return settings_; }

  std::optional<TuningEntry> find_tuning(const TuningKey& key);
  bool put_tuning(const TuningEntry& entry);
  std::optional<KernelImage> find_kernel(const KernelKey& key);
  bool put_kernel(const KernelKey& key, const KernelImage& image);

  Store* user();  // opened on first use; null when persistence is off
  const std::vector<std::unique_ptr<Store>>& shared();

 private:
  void open_all();
  Settings settings_;
  std::once_flag opened_;
  std::unique_ptr<Store> user_;
  std::vector<std::unique_ptr<Store>> shared_;
};

// The process's cache (from the environment until configure_process_cache is called).
std::shared_ptr<LayeredCache> process_cache();
void configure_process_cache(const Settings& settings);

}  // namespace gnsilu::cache
