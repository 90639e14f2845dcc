// gnsilu-tune verify: re-timing the cached winners on this GPU (drift), and verify --kernels: rebuilding every
// cached kernel with NVRTC and comparing its bytes (also what import --verify-kernels runs: check_kernels).
#include <cstdio>
#include <span>

#include "commands.hpp"
#include "commands_common.hpp"
#include "gpu.hpp"
#include "cache/transfer/transfer.hpp"
#include "runtime/kernels.hpp"

namespace gnsilu::tune {

using nlohmann::json;
using cache::config_json;
using cache::key_json;

namespace {

KernelCheck check_kernel(const cache::KernelRecord& k) {
  KernelCheck c{k.key, ""};
  if (k.key.code_version != detail::code_version()) {
    c.status = "other kernel version";
    return c;
  }
  const auto variant = detail::variant_of_code_name(k.key.variant);
  if (!variant) {
    c.status = "unknown variant";
    return c;
  }
  try {
    const auto rebuilt = detail::compile_variants(k.key.arch, std::span<const detail::Variant>(&*variant, 1));
    const bool same = rebuilt.is_cubin == k.image.is_cubin && rebuilt.image == k.image.image &&
                      rebuilt.lowered_names == k.image.lowered_names;
    c.status = same ? "same" : "differs";
  } catch (const std::exception& e) {
    c.status = std::string("compile failed: ") + e.what();
  }
  return c;
}

// The counts of verify --kernels' summary.
struct KernelCounts {
  int same = 0, differ = 0, other = 0, failed = 0;
};

void verify_kernels_text(const std::vector<KernelCheck>& checks, const KernelCounts& n, const std::string& path) {
  for (const auto& c : checks) {
    if (c.status != "same") std::printf("%s  sm_%d %s\n", c.status.c_str(), c.key.arch, c.key.variant.c_str());
  }
  std::printf("%zu kernels in %s: %d the same bytes as their rebuild, %d differ, %d of another kernel version "
              "(not rebuilt), %d could not be rebuilt\n",
              checks.size(), path.c_str(), n.same, n.differ, n.other, n.failed);
}

void verify_text(const std::vector<VerifyRow>& rows, const std::string& device, std::size_t others, int drifted,
                 double tolerance, int failed) {
  std::vector<std::vector<std::string>> table{{"status", "key", "layout", "activation", "winner", "cached us", "now us",
                                               "drift", "default now us", "winner/default now"}};
  for (const auto& r : rows) {
    const cache::TuningKey& key = r.entry.key;
    table.push_back({r.status.substr(0, 40), key_text(key, false), layout_name(key.layout),
                     activation_name(key.activation), config_text(r.entry.winner), fixed(r.entry.best_us, 1),
                     fixed(r.winner_us, 1), fixed(100 * r.drift, 1) + "%", fixed(r.default_us, 1),
                     r.default_us > 0 ? fixed(r.winner_us / r.default_us, 3) : "-"});
  }
  print_table(table);
  std::printf("%zu entries re-timed on %s (%zu others are for other devices or kernel versions): %d drifted by more "
              "than %.0f%%, %d failed\n",
              rows.size(), device.c_str(), others, drifted, 100 * tolerance, failed);
}

int run_verify_kernels(const VerifyOptions& o) {
  const std::string path = cache_path(o.common.cache);
  if (path.empty() || !file_exists(path)) throw CliError(kBadInput, "no cache file to verify (" + path + ")");
  cache::Bundle bundle;
  try {
    bundle = cache::read_bundle(path, true, true);  // every kernel, whatever the trust check says
  } catch (const cache::TransferError& e) {
    throw CliError(kBadInput, e.what());
  }
  const auto checks = check_kernels(bundle.kernels, o.common);
  KernelCounts n;
  n.same = count_status(checks, "same");
  n.differ = count_status(checks, "differs");
  n.other = count_status(checks, "other kernel version");
  n.failed = static_cast<int>(checks.size()) - n.same - n.differ - n.other;
  json list = json::array();
  for (const auto& c : checks)
    list.push_back({{"arch", c.key.arch}, {"code_version", c.key.code_version}, {"variant", c.key.variant},
                    {"status", c.status}});
  return emit(o.common.json,
              {{"cache", path}, {"kernels", list}, {"same", n.same}, {"differ", n.differ},
               {"other_kernel_version", n.other}, {"not_rebuilt", n.failed}},
              [&] { verify_kernels_text(checks, n, path); },
              n.differ > 0 ? kKernelDiffers : n.failed > 0 ? kFailed : kOk);
}

}  // namespace

std::vector<KernelCheck> check_kernels(const std::vector<cache::KernelRecord>& kernels, const Common& common) {
  Progress progress(kernels.size(), !common.quiet && !common.json);
  std::vector<KernelCheck> checks;
  for (const auto& k : kernels) {
    checks.push_back(check_kernel(k));
    progress.step(checks.back().status + "  sm_" + std::to_string(k.key.arch) + " " + k.key.variant);
  }
  return checks;
}

int count_status(const std::vector<KernelCheck>& checks, const std::string& status) {
  int n = 0;
  for (const auto& c : checks) n += c.status == status;
  return n;
}

int run_verify(const VerifyOptions& o) {
  if (o.kernels) return run_verify_kernels(o);
  if (o.samples < 3) throw CliError(kUsage, "--samples must be at least 3");
  if (!(o.tolerance > 0)) throw CliError(kUsage, "--tolerance must be positive");
  const std::string path = cache_path(o.common.cache);
  const auto entries = entries_of(path);
  std::string why;
  auto gpu = GpuSession::open(o.device, why);
  if (!gpu) throw CliError(kNoGpu, "verify re-times kernels and needs a GPU: " + why);
  use_cache_file(path);
  std::vector<cache::TuningEntry> mine;
  for (const auto& e : entries) {
    if (e.key.device == gpu->identity() && e.key.code_version == detail::code_version()) mine.push_back(e);
  }
  Progress progress(mine.size(), !o.common.quiet && !o.common.json);
  const auto rows = verify(*gpu, mine, o.samples, o.tolerance, progress);
  int drifted = 0, failed = 0;
  for (const auto& r : rows) {
    drifted += r.status == "drift";
    failed += r.status.starts_with("failed");
  }
  json list = json::array();
  for (const auto& r : rows) {
    list.push_back({{"key", key_json(r.entry.key)},
                    {"winner", config_json(r.entry.winner)},
                    {"cached_best_us", r.entry.best_us},
                    {"winner_us", r.winner_us},
                    {"default_us", r.default_us},
                    {"drift", r.drift},
                    {"status", r.status}});
  }
  const int code = failed > 0 ? kFailed : o.strict && drifted > 0 ? kDrift : kOk;
  return emit(o.common.json,
              {{"cache", path},
               {"device", device_json(*gpu)},
               {"tolerance", o.tolerance},
               {"entries", list},
               {"other_entries", entries.size() - mine.size()},
               {"drifted", drifted},
               {"failed", failed}},
              [&] {
                verify_text(rows, gpu->identity().name, entries.size() - mine.size(), drifted, o.tolerance, failed);
              },
              code);
}

}  // namespace gnsilu::tune
