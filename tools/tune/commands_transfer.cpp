// gnsilu-tune export, import, merge and prune: moving cache contents between files and machines, and dropping
// what no current kernel version can use.
#include <cstdio>
#include <optional>

#include "commands.hpp"
#include "commands_common.hpp"
#include "gpu.hpp"
#include "cache/transfer/transfer.hpp"
#include "runtime/kernels.hpp"

namespace gnsilu::tune {
namespace {

using nlohmann::json;
using cache::config_json;
using cache::key_json;

cache::Bundle read_input(const std::string& file, bool with_kernels) {
  try {
    return cache::read_bundle(file, with_kernels);
  } catch (const cache::TransferError& e) {
    throw CliError(kBadInput, e.what());
  }
}

// The counts and conflicts of a merge: the fields import and merge share.
json report_json(const cache::MergeReport& r) {
  json conflicts = json::array();
  for (const auto& c : r.conflicts) {
    conflicts.push_back({{"key", key_json(c.key)}, {"kept", config_json(c.kept)}, {"dropped", config_json(c.dropped)},
                         {"incoming_kept", c.incoming_kept}});
  }
  return {{"added", r.added},
          {"replaced", r.replaced},
          {"kept", r.kept},
          {"identical", r.identical},
          {"kernels_added", r.kernels_added},
          {"kernels_identical", r.kernels_identical},
          {"kernels_replaced", r.kernels_replaced},
          {"conflicts", conflicts}};
}

// The text of a merge report, after `verb` ("imported a.json into b.sqlite").
void report_text(const cache::MergeReport& r, const std::string& verb) {
  std::printf("%s: %d entries added, %d replaced by better-measured ones, %d kept over worse-measured ones, %d "
              "identical; %d kernels added, %d identical, %d replaced\n",
              verb.c_str(), r.added, r.replaced, r.kept, r.identical, r.kernels_added, r.kernels_identical,
              r.kernels_replaced);
  for (const auto& c : r.conflicts) {
    std::printf("  conflict %s: kept %s (%s), dropped %s\n", key_text(c.key).c_str(), config_text(c.kept).c_str(),
                c.incoming_kept ? "incoming" : "existing", config_text(c.dropped).c_str());
  }
}

}  // namespace

int run_export(const TransferOptions& o) {
  const std::string path = cache_path(o.common.cache);
  auto store = open_for_reading(path);
  const cache::Bundle bundle = cache::bundle_of(*store, !o.no_kernels);
  if (!store->usable()) throw CliError(kBadInput, path + ": " + store->problem());
  try {
    cache::write_export(bundle, o.file);
  } catch (const cache::TransferError& e) {
    throw CliError(kFailed, e.what());
  }
  return emit(o.common.json,
              {{"exported", o.file}, {"from", path}, {"entries", bundle.tuning.size()}, {"kernels", bundle.kernels.size()}},
              [&] {
                std::printf("exported %zu tuned entries and %zu compiled kernels from %s to %s\n", bundle.tuning.size(),
                            bundle.kernels.size(), path.c_str(), o.file.c_str());
              });
}

int run_import(const TransferOptions& o) {
  cache::Bundle bundle = read_input(o.file, !o.no_kernels);
  std::string why;
  auto gpu = GpuSession::open(o.device, why);
  std::optional<cache::DeviceIdentity> device;
  if (gpu) device = gpu->identity();
  cache::Bundle refused = cache::take_mismatched(bundle, device, detail::code_version());
  if (!gpu && !o.force) {
    throw CliError(kRefused, "no GPU here (" + why + ") to check " + o.file +
                                 "'s device identity against; --force imports it unchecked");
  }
  const bool mismatch = !refused.tuning.empty() || !refused.kernels.empty();
  if (mismatch && !o.force && !o.skip_mismatched) {
    std::string what;
    for (const auto& e : refused.tuning) {
      if (e.key.code_version != detail::code_version()) {
        what = "entries for another kernel version (" + e.key.code_version + ", this gnsilu has " + detail::code_version() + ")";
        break;
      }
      what = "entries for another device (" + e.key.device.name + " sm" + std::to_string(e.key.device.arch) + ", " +
             std::to_string(e.key.device.sms) + " SMs, " + std::to_string(e.key.device.memory_mib) + " MiB)";
    }
    if (what.empty()) what = "kernels for another architecture or kernel version";
    throw CliError(kRefused, o.file + ": " + std::to_string(refused.tuning.size()) + " tuned entries and " +
                                 std::to_string(refused.kernels.size()) + " kernels do not fit this machine: " + what +
                                 ". Nothing imported; --skip-mismatched imports the rest, --force everything");
  }
  if (o.force) {
    for (auto& e : refused.tuning) bundle.tuning.push_back(std::move(e));
    for (auto& k : refused.kernels) bundle.kernels.push_back(std::move(k));
    refused = {};
  }
  std::size_t verified = 0;
  if (o.verify_kernels && !bundle.kernels.empty()) {
    const auto checks = check_kernels(bundle.kernels, o.common);
    const int differ = count_status(checks, "differs");
    const int unchecked = static_cast<int>(checks.size()) - differ - count_status(checks, "same");
    if (differ > 0 || unchecked > 0) {
      std::string first;
      for (const auto& c : checks)
        if (c.status != "same" && first.empty()) first = "sm_" + std::to_string(c.key.arch) + " " + c.key.variant + ": " + c.status;
      throw CliError(differ > 0 ? kKernelDiffers : kRefused,
                     o.file + ": " + std::to_string(differ) + " of " + std::to_string(checks.size()) +
                         " kernels differ from their rebuild and " + std::to_string(unchecked) +
                         " could not be rebuilt here (" + first + "). Nothing imported; --no-kernels imports the "
                         "tuned entries alone");
    }
    if (!o.common.quiet) verified = checks.size();
  }
  const std::string path = cache_path(o.common.cache);
  auto store = open_for_writing(path);
  cache::MergeReport r;
  try {
    r = cache::merge_into(*store, bundle, o.dry_run);
  } catch (const cache::TransferError& e) {
    throw CliError(kBadInput, e.what());
  }
  json doc = report_json(r);
  doc["into"] = path;
  doc["from"] = o.file;
  doc["dry_run"] = o.dry_run;
  doc["skipped_mismatched"] = {{"entries", refused.tuning.size()}, {"kernels", refused.kernels.size()}};
  // `verified`: how many kernels import --verify-kernels rebuilt identically first (0: none checked).
  return emit(o.common.json, doc, [&] {
    if (verified > 0) std::printf("verified %zu kernels: each the same bytes as its rebuild\n", verified);
    report_text(r, std::string(o.dry_run ? "would import" : "imported") + " " + o.file + " into " + path);
    if (!refused.tuning.empty() || !refused.kernels.empty()) {
      std::printf("skipped %zu entries and %zu kernels made for another device or kernel version\n",
                  refused.tuning.size(), refused.kernels.size());
    }
  });
}

int run_merge(const TransferOptions& o) {
  cache::Bundle merged;
  cache::MergeReport total;
  for (const auto& in : o.inputs) {
    const cache::MergeReport r = cache::merge(merged, read_input(in, !o.no_kernels));
    total.added += r.added;
    total.replaced += r.replaced;
    total.kept += r.kept;
    total.identical += r.identical;
    total.kernels_added += r.kernels_added;
    total.kernels_identical += r.kernels_identical;
    total.kernels_replaced += r.kernels_replaced;
    total.conflicts.insert(total.conflicts.end(), r.conflicts.begin(), r.conflicts.end());
  }
  const bool to_export = o.file.ends_with(".json");
  if (to_export) {
    try {
      cache::write_export(merged, o.file);
    } catch (const cache::TransferError& e) {
      throw CliError(kFailed, e.what());
    }
  } else {
    auto store = open_for_writing(o.file);
    try {
      // Counts against the output's contents; conflicts between the inputs are listed too.
      cache::MergeReport r = cache::merge_into(*store, merged, false);
      r.conflicts.insert(r.conflicts.begin(), total.conflicts.begin(), total.conflicts.end());
      total = std::move(r);
    } catch (const cache::TransferError& e) {
      throw CliError(kBadInput, e.what());
    }
  }
  json doc = report_json(total);
  doc["into"] = o.file;
  doc["inputs"] = o.inputs;
  doc["entries"] = merged.tuning.size();
  doc["kernels"] = merged.kernels.size();
  return emit(o.common.json, doc, [&] {
    report_text(total, "merged " + std::to_string(o.inputs.size()) + " files into " + o.file);
  });
}

int run_prune(const TransferOptions& o) {
  const std::string path = cache_path(o.common.cache);
  if (!file_exists(path)) throw CliError(kBadInput, path + ": no such cache file");
  auto store = o.dry_run ? open_for_reading(path) : open_for_writing(path);
  const std::string& current = detail::code_version();
  int entries = 0, kernels = 0;
  for (const auto& e : store->all_tuning()) {
    if (e.key.code_version == current) continue;
    ++entries;
    if (!o.dry_run && !store->remove_tuning(e.key)) throw CliError(kBadInput, path + ": " + store->problem());
  }
  for (const auto& k : store->kernel_keys()) {
    if (k.code_version == current) continue;
    ++kernels;
    if (!o.dry_run && !store->remove_kernel(k)) throw CliError(kBadInput, path + ": " + store->problem());
  }
  if (!store->usable()) throw CliError(kBadInput, path + ": " + store->problem());
  return emit(o.common.json,
              {{"cache", path}, {"dry_run", o.dry_run}, {"entries_removed", entries}, {"kernels_removed", kernels},
               {"code_version", current}},
              [&] {
                std::printf("%s %d tuned entries and %d compiled kernels of other kernel versions from %s (current: "
                            "%s)\n",
                            o.dry_run ? "would remove" : "removed", entries, kernels, path.c_str(), current.c_str());
              });
}

}  // namespace gnsilu::tune
