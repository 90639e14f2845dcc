// gnsilu-tune list and show: what a cache file holds, and one entry with every candidate's timing.
#include <algorithm>
#include <cstdio>
#include <ctime>

#include "commands.hpp"
#include "commands_common.hpp"
#include "cache/transfer/transfer.hpp"
#include "runtime/kernels.hpp"

namespace gnsilu::tune {
namespace {

using nlohmann::json;
using cache::config_json;
using cache::key_json;

std::string age_text(int64_t created_at) {
  const int64_t s = std::max<int64_t>(0, static_cast<int64_t>(std::time(nullptr)) - created_at);
  if (s < 120) return std::to_string(s) + " s";
  if (s < 7200) return std::to_string(s / 60) + " min";
  if (s < 172800) return std::to_string(s / 3600) + " h";
  return std::to_string(s / 86400) + " d";
}

bool is_current(const cache::TuningEntry& e) { return e.key.code_version == detail::code_version(); }

json entry_summary_json(const cache::TuningEntry& e, std::size_t id) {
  return {{"id", id},
          {"key", key_json(e.key)},
          {"current", is_current(e)},
          {"winner", config_json(e.winner)},
          {"best_us", e.best_us},
          {"default_us", e.default_us},
          {"noise_us", e.noise_us},
          {"speedup", speedup(e)},
          {"tuned_shape", e.tuned_shape.text()},
          {"tuned_dims", e.tuned_shape.dims},
          {"tuned_groups", e.tuned_shape.groups},
          {"path", path_name(e.tuned_shape.path)},
          {"library_version", e.library_version},
          {"created_at", e.created_at}};
}

void list_text(const std::string& path, bool exists, const std::vector<cache::TuningEntry>& entries, int64_t kernels) {
  if (!exists) {
    std::printf("%s: no cache file yet (nothing tuned)\n", path.empty() ? "(cache off)" : path.c_str());
    return;
  }
  std::vector<std::vector<std::string>> table{
      {"#", "device", "cpg", "dtypes", "layout", "activation", "class", "winner", "us", "speedup", "age", "state"}};
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const cache::TuningEntry& e = entries[i];
    const cache::TuningKey& key = e.key;
    table.push_back({std::to_string(i + 1), key.device.name + " sm" + std::to_string(key.device.arch),
                     std::to_string(key.channels_per_group), pair_text(key.x_dtype, key.y_dtype), layout_name(key.layout),
                     activation_name(key.activation), key.size_class, config_text(e.winner), fixed(e.best_us, 1),
                     fixed(speedup(e), 2) + "x", age_text(e.created_at),
                     is_current(e) ? "current" : "stale (prune removes)"});
  }
  print_table(table);
  std::printf("%zu tuned entries, %lld compiled kernels in %s\n", entries.size(), static_cast<long long>(kernels),
              path.c_str());
}

// Entry `id` (1-based) of the cache file `path`, with every candidate's timing, fastest first.
void show_text(const cache::TuningEntry& e, int id, const std::string& path) {
  const cache::TuningKey& key = e.key;
  std::printf("entry %d of %s\n  key:        %s\n  layout:     %s\n  activation: %s\n  code:       %s (%s)\n"
              "  device:     %s, sm_%d, %d SMs, %lld MiB, L2 %d KiB\n"
              "  winner:     %s at %.2f us; default %.2f us (%.2fx); noise %.2f us\n  tuned on:   %s, %s ago, gnsilu %s\n",
              id, path.c_str(), key_text(key).c_str(), layout_text(key.layout).c_str(),
              activation_text(key.activation).c_str(), key.code_version.c_str(), is_current(e) ? "current" : "stale",
              key.device.name.c_str(), key.device.arch, key.device.sms, static_cast<long long>(key.device.memory_mib),
              key.device.l2_kib, config_text(e.winner).c_str(), e.best_us, e.default_us, speedup(e), e.noise_us,
              e.tuned_shape.text().c_str(), age_text(e.created_at).c_str(), e.library_version.c_str());
  std::vector<std::vector<std::string>> table{{"  candidate", "median us", "noise us", "samples", "status"}};
  std::vector<cache::CandidateTiming> sorted = e.candidates;
  auto median = [](const cache::CandidateTiming& c) { return c.median_us > 0 ? c.median_us : 1e300; };
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](const cache::CandidateTiming& a, const cache::CandidateTiming& b) { return median(a) < median(b); });
  for (const auto& c : sorted) {
    table.push_back({"  " + config_text(c.config) + (c.config == e.winner ? " *" : ""), fixed(c.median_us, 2),
                     fixed(c.noise_us, 2), std::to_string(c.samples), c.status});
  }
  print_table(table);
}

}  // namespace

int run_list(const Common& o) {
  const std::string path = cache_path(o.cache);
  std::vector<cache::TuningEntry> entries;
  int64_t kernels = 0;
  const bool exists = !path.empty() && file_exists(path);
  if (exists) {
    auto store = open_for_reading(path);
    entries = store->all_tuning();
    kernels = store->kernel_count();
    if (!store->usable()) throw CliError(kBadInput, path + ": " + store->problem());
  }
  json list = json::array();
  for (std::size_t i = 0; i < entries.size(); ++i) list.push_back(entry_summary_json(entries[i], i + 1));
  return emit(o.json, {{"cache", path}, {"exists", exists}, {"entries", list}, {"kernels", kernels}},
              [&] { list_text(path, exists, entries, kernels); });
}

int run_show(const ShowOptions& o) {
  const std::string path = cache_path(o.common.cache);
  const auto entries = entries_of(path);
  if (o.id < 1 || static_cast<std::size_t>(o.id) > entries.size()) {
    throw CliError(kUsage, "entry " + std::to_string(o.id) + " does not exist: " + path + " holds " +
                               std::to_string(entries.size()) + " entries (see gnsilu-tune list)");
  }
  const auto& e = entries[static_cast<std::size_t>(o.id - 1)];
  json doc = entry_summary_json(e, static_cast<std::size_t>(o.id));
  json cands = json::array();
  for (const auto& c : e.candidates) cands.push_back(cache::candidate_json(c));
  doc["candidates"] = cands;
  return emit(o.common.json, doc, [&] { show_text(e, o.id, path); });
}

}  // namespace gnsilu::tune
