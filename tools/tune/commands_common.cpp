// What the subcommand files of gnsilu-tune share (commands_common.hpp).
#include "commands_common.hpp"

#include <sys/stat.h>

#include "cache/cache.hpp"
#include "gpu.hpp"

namespace gnsilu::tune {

using nlohmann::json;

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::unique_ptr<cache::Store> open_for_reading(const std::string& path) {
  if (path.empty()) throw CliError(kBadInput, "the cache is off (GNSILU_CACHE=off): give --cache FILE");
  if (!file_exists(path)) throw CliError(kBadInput, path + ": no such cache file");
  auto store = cache::Store::read_upgraded(path);
  if (!store->usable()) throw CliError(kBadInput, path + ": " + store->problem());
  return store;
}

std::unique_ptr<cache::Store> open_for_writing(const std::string& path) {
  if (path.empty()) throw CliError(kBadInput, "the cache is off (GNSILU_CACHE=off): give --cache FILE");
  auto store = std::make_unique<cache::Store>(path, cache::Store::Mode::ReadWrite);
  if (!store->writable()) throw CliError(kBadInput, path + ": " + store->problem());
  return store;
}

std::vector<cache::TuningEntry> entries_of(const std::string& path) {
  auto store = open_for_reading(path);
  auto entries = store->all_tuning();
  if (!store->usable()) throw CliError(kBadInput, path + ": " + store->problem());
  return entries;
}

void use_cache_file(const std::string& path) {
  cache::Settings s = cache::settings_from_environment();
  s.user_path = path;
  cache::configure_process_cache(s);
}

double speedup(const cache::TuningEntry& e) { return e.best_us > 0 ? e.default_us / e.best_us : 1.0; }

json device_json(const GpuSession& gpu) {
  const auto id = gpu.identity();
  return {{"name", id.name}, {"arch", id.arch}, {"sms", id.sms}, {"memory_mib", id.memory_mib}, {"l2_kib", id.l2_kib}};
}

}  // namespace gnsilu::tune
