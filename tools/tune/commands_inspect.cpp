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

json entry_summary_json(const cache::TuningEntry& e, std::size_t id) {
  return {{"id", id},
          {"key", key_json(e.key)},
          {"current", e.key.code_version == detail::code_version()},
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

void list_text(const json& r) {
  const std::string path = r["cache"].get<std::string>();
  if (!r["exists"].get<bool>()) {
    std::printf("%s: no cache file yet (nothing tuned)\n", path.empty() ? "(cache off)" : path.c_str());
    return;
  }
  std::vector<std::vector<std::string>> table{
      {"#", "device", "cpg", "dtypes", "layout", "activation", "class", "winner", "us", "speedup", "age", "state"}};
  for (const auto& e : r["entries"]) {
    const cache::TuningKey key = key_of(e["key"]);
    table.push_back({std::to_string(e["id"].get<std::size_t>()), key.device.name + " sm" + std::to_string(key.device.arch),
                     std::to_string(key.channels_per_group), pair_text(key.x_dtype, key.y_dtype), layout_name(key.layout),
                     activation_name(key.activation), key.size_class, config_text_of(e["winner"]),
                     fixed(e["best_us"].get<double>(), 1), fixed(e["speedup"].get<double>(), 2) + "x",
                     age_text(e["created_at"].get<int64_t>()),
                     e["current"].get<bool>() ? "current" : "stale (prune removes)"});
  }
  print_table(table);
  std::printf("%zu tuned entries, %lld compiled kernels in %s\n", r["entries"].size(),
              static_cast<long long>(r["kernels"].get<int64_t>()), path.c_str());
}

// `path`: the cache file, which show's document does not name.
void show_text(const json& e, const std::string& path) {
  const cache::TuningKey key = key_of(e["key"]);
  const json& winner = e["winner"];
  std::printf("entry %d of %s\n  key:        %s\n  layout:     %s\n  activation: %s\n  code:       %s (%s)\n"
              "  device:     %s, sm_%d, %d SMs, %lld MiB, L2 %d KiB\n"
              "  winner:     %s at %.2f us; default %.2f us (%.2fx); noise %.2f us\n  tuned on:   %s, %s ago, gnsilu %s\n",
              e["id"].get<int>(), path.c_str(), key_text(key).c_str(), layout_text(key.layout).c_str(),
              activation_text(key.activation).c_str(), key.code_version.c_str(),
              e["current"].get<bool>() ? "current" : "stale", key.device.name.c_str(), key.device.arch, key.device.sms,
              static_cast<long long>(key.device.memory_mib), key.device.l2_kib, config_text_of(winner).c_str(),
              e["best_us"].get<double>(), e["default_us"].get<double>(), e["speedup"].get<double>(),
              e["noise_us"].get<double>(), e["tuned_shape"].get<std::string>().c_str(),
              age_text(e["created_at"].get<int64_t>()).c_str(), e["library_version"].get<std::string>().c_str());
  std::vector<std::vector<std::string>> table{{"  candidate", "median us", "noise us", "samples", "status"}};
  std::vector<json> sorted(e["candidates"].begin(), e["candidates"].end());
  auto median = [](const json& c) {
    const double us = c["median_us"].get<double>();
    return us > 0 ? us : 1e300;
  };
  std::stable_sort(sorted.begin(), sorted.end(), [&](const json& a, const json& b) { return median(a) < median(b); });
  for (const auto& c : sorted) {
    table.push_back({"  " + config_text_of(c["config"]) + (config_of(c["config"]) == config_of(winner) ? " *" : ""),
                     fixed(c["median_us"].get<double>(), 2), fixed(c["noise_us"].get<double>(), 2),
                     std::to_string(c["samples"].get<int>()), c["status"].get<std::string>()});
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
  return emit(o.json, {{"cache", path}, {"exists", exists}, {"entries", list}, {"kernels", kernels}}, list_text);
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
  return emit(o.common.json, doc, [&path](const json& r) { show_text(r, path); });
}

}  // namespace gnsilu::tune
