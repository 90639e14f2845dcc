#include "commands.hpp"

#include "archs.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <set>

#include "cache/cache.hpp"
#include "tuning/config_table.hpp"
#include "gpu.hpp"
#include "runtime/kernels.hpp"
#include "runtime/plan.hpp"
#include "report.hpp"
#include "cache/store.hpp"
#include "cache/transfer.hpp"

namespace gnsilu::tune {
namespace {

using nlohmann::json;
using cache::config_json;
using cache::key_json;

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void print_json(const json& doc) { std::printf("%s\n", doc.dump(2).c_str()); }

// A cache file opened for reading (one of an older schema through an upgraded copy in memory: reading never
// changes it); kBadInput when it is missing or unusable.
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

std::string age_text(int64_t created_at) {
  const int64_t s = std::max<int64_t>(0, static_cast<int64_t>(std::time(nullptr)) - created_at);
  if (s < 120) return std::to_string(s) + " s";
  if (s < 7200) return std::to_string(s / 60) + " min";
  if (s < 172800) return std::to_string(s / 3600) + " h";
  return std::to_string(s / 86400) + " d";
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

double speedup(const cache::TuningEntry& e) { return e.best_us > 0 ? e.default_us / e.best_us : 1.0; }

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

std::vector<DTypePair> pairs_of(const std::vector<std::string>& texts) {
  std::vector<DTypePair> pairs;
  for (const auto& t : texts) {
    add_unique(pairs, parse_dtype_pair(t));
  }
  return pairs;
}

std::vector<DTypePair> all_pairs() {
  std::vector<DTypePair> pairs;
  for (DType x : {DType::BF16, DType::FP16, DType::FP32})
    for (DType y : {DType::BF16, DType::FP16, DType::FP32}) pairs.push_back({x, y});
  return pairs;
}

// The requests of warm: command-line shapes, shape files and presets, each with every dtype pair and layout asked
// for; command-line shapes (and file items that list none) in every activation asked for (default SiLU), preset
// shapes in the activation their model applies (kept only if asked for, when --activation is given).
std::vector<ShapeRequest> requests_of(const WarmOptions& o) {
  const std::vector<DTypePair> pairs = pairs_of(o.dtypes);
  if (pairs.empty()) throw CliError(kUsage, "--dtype: give at least one dtype");
  if (o.groups <= 0) throw CliError(kUsage, "--groups must be positive");
  const Forms forms{pairs, layouts_of(o.layouts),
                    o.activations.empty() ? std::vector<Activation>{Activation::SiLU} : activations_of(o.activations)};
  auto each_form = [&](const ShapeRequest& r, const std::vector<Activation>& activations, std::vector<ShapeRequest>& out) {
    for (const auto& p : pairs) {
      for (Layout l : forms.layouts) {
        for (Activation a : activations) {
          ShapeRequest q = r;
          q.x = p.x;
          q.y = p.y;
          q.layout = l;
          q.activation = a;
          out.push_back(std::move(q));
        }
      }
    }
  };
  std::vector<ShapeRequest> out;
  for (const auto& s : o.shapes) {
    ShapeRequest r;
    r.shape = parse_shape(s);
    r.groups = o.groups;
    r.origin = "command line";
    each_form(r, forms.activations, out);
  }
  PresetOptions preset = o.preset;
  if (!o.resolution.empty()) parse_resolution(o.resolution, preset.height, preset.width);
  if (preset.batch <= 0) throw CliError(kUsage, "--batch must be positive");
  for (const auto& p : o.presets) {
    for (const auto& r : preset_shapes(p, preset)) {
      const bool asked = o.activations.empty() ||
                         std::find(forms.activations.begin(), forms.activations.end(), r.activation) !=
                             forms.activations.end();
      if (asked) each_form(r, {r.activation}, out);
    }
  }
  for (const auto& f : o.shape_files) {
    for (auto& r : shapes_from_json(f, forms)) out.push_back(std::move(r));
  }
  if (out.empty()) throw CliError(kUsage, "nothing to warm: give shapes (like 1x512x128x128), --preset or --shapes-file");
  for (const auto& r : out) geometry_of(r);  // every request checked before any work
  return out;
}

void use_cache_file(const std::string& path) {
  cache::Settings s = cache::settings_from_environment();
  s.user_path = path;
  cache::configure_process_cache(s);
}

json device_json(const GpuSession& gpu) {
  const auto id = gpu.identity();
  return {{"name", id.name}, {"arch", id.arch}, {"sms", id.sms}, {"memory_mib", id.memory_mib}, {"l2_kib", id.l2_kib}};
}

// The --arch values as compute capabilities; CliError(kUsage) naming a value not understood.
std::vector<int> archs_of(const std::vector<std::string>& values) {
  std::string bad;
  std::vector<int> archs = parse_archs(values, bad);
  if (!bad.empty()) {
    throw CliError(kUsage, "--arch " + bad + ": not an architecture; give it as 90, sm_90, sm90, compute_90 or "
                                             "9.0 (comma lists too)");
  }
  return archs;
}

int compile_only(const std::vector<int>& archs, const std::vector<KernelForm>& forms, const Common& c,
                 const std::string& reason) {
  for (int a : archs) {
    if (a < 75) throw CliError(kUsage, "--arch " + std::to_string(a) + ": gnsilu needs compute capability 7.5 or newer (75)");
  }
  std::string arch_list;
  for (int a : archs) arch_list += (arch_list.empty() ? "sm_" : ", sm_") + std::to_string(a);
  // What the forms cover, for the summary.
  std::vector<std::string> dtypes, layouts, activations;
  auto note = [](std::vector<std::string>& list, const std::string& name) {
    if (std::find(list.begin(), list.end(), name) == list.end()) list.push_back(name);
  };
  for (const auto& f : forms) {
    note(dtypes, pair_text(f.pair.x, f.pair.y));
    note(layouts, layout_name(f.layout));
    note(activations, activation_name(f.activation));
  }
  Progress progress(archs.size() * forms.size() * codes_per_form(), !c.quiet && !c.json);
  if (!reason.empty()) progress.note(reason);
  const std::size_t variants = compile_all(archs, forms, progress);
  const auto& k = detail::counters();
  const uint64_t compiled = k.compiled.load(), found = k.kernels_from_cache.load();
  if (c.json) {
    print_json({{"mode", "compile"},
                {"archs", archs},
                {"dtypes", dtypes},
                {"layouts", layouts},
                {"activations", activations},
                {"cache", cache_path(c.cache)},
                {"variants", variants},
                {"compiled", compiled},
                {"from_cache", found},
                {"note", reason}});
  } else {
    auto joined = [](const std::vector<std::string>& list) {
      std::string out;
      for (const auto& x : list) out += (out.empty() ? "" : ",") + x;
      return out;
    };
    std::printf("%zu kernel variants for %s (%s; %s; %s): %llu compiled, %llu already in the cache (%s)\n", variants,
                arch_list.c_str(), joined(dtypes).c_str(), joined(layouts).c_str(), joined(activations).c_str(),
                static_cast<unsigned long long>(compiled), static_cast<unsigned long long>(found),
                cache_path(c.cache).empty() ? "cache off" : cache_path(c.cache).c_str());
  }
  return kOk;
}

}  // namespace

int run_warm(const WarmOptions& o) {
  const std::vector<ShapeRequest> requests = requests_of(o);
  const std::string path = cache_path(o.common.cache);
  use_cache_file(path);
  std::string why;
  std::unique_ptr<GpuSession> gpu;
  if (!o.compile_only) gpu = GpuSession::open(o.device, why);
  if (!gpu) {
    // Without a GPU only the compiled-kernel cache can be prepared: the programs of every form the requests take
    // (in the geometry's layout: channels-first where both layouts are the same memory).
    std::vector<KernelForm> forms;
    for (const auto& r : requests) add_unique(forms, {{r.x, r.y}, geometry_of(r).layout, r.activation});
    const std::vector<int> archs = o.archs.empty() ? std::vector<int>{90} : archs_of(o.archs);
    const std::string reason =
        o.compile_only ? std::string("compile only: no timing")
                       : "no GPU here (" + why + "): compiling kernels only" +
                             (o.archs.empty() ? std::string(", for sm_90 (choose with --arch)") : std::string());
    return compile_only(archs, forms, o.common, reason);
  }
  if (!o.archs.empty()) throw CliError(kUsage, "--arch applies without a GPU or with --compile-only");

  const std::size_t keys = keys_of(*gpu, requests).size();
  Progress progress(keys, !o.common.quiet && !o.common.json);
  progress.note("warming " + std::to_string(keys) + " tuning keys (" + std::to_string(requests.size()) +
                " shapes) on " + gpu->info().name + " into " + (path.empty() ? "memory (cache off)" : path));
  const auto rows = warm(*gpu, requests, o.retune, o.wait, progress);
  std::map<std::string, int> outcomes;
  for (const auto& r : rows) outcomes[r.outcome]++;
  const auto& k = detail::counters();
  const bool ok = outcomes["failed"] == 0 && outcomes["busy"] == 0;
  if (o.common.json) {
    json list = json::array();
    for (const auto& r : rows) {
      json row = {{"key", key_json(r.key)},   {"outcome", r.outcome},         {"shape", shape_text(r.request.shape)},
                  {"groups", r.request.groups}, {"origin", r.request.origin}, {"seconds", r.seconds}};
      if (r.entry) {
        row["winner"] = config_json(r.entry->winner);
        row["best_us"] = r.entry->best_us;
        row["default_us"] = r.entry->default_us;
        row["speedup"] = speedup(*r.entry);
      }
      if (!r.message.empty()) row["message"] = r.message;
      list.push_back(row);
    }
    print_json({{"mode", "tune"},
                {"device", device_json(*gpu)},
                {"cache", path},
                {"keys", list},
                {"summary",
                 {{"keys", rows.size()},
                  {"cached", outcomes["cached"]},
                  {"tuned", outcomes["tuned"]},
                  {"tuned_by_another_process", outcomes["tuned by another process"]},
                  {"busy", outcomes["busy"]},
                  {"failed", outcomes["failed"]},
                  {"compiled", k.compiled.load()},
                  {"kernels_from_cache", k.kernels_from_cache.load()}}}});
  } else {
    std::vector<std::vector<std::string>> table{
        {"outcome", "key", "layout", "activation", "winner", "us", "default us", "speedup", "s"}};
    for (const auto& r : rows) {
      table.push_back({r.outcome, key_text(r.key, false), layout_name(r.key.layout), activation_name(r.key.activation),
                       r.entry ? config_text(r.entry->winner) : "-",
                       r.entry ? fixed(r.entry->best_us, 1) : "-", r.entry ? fixed(r.entry->default_us, 1) : "-",
                       r.entry ? fixed(speedup(*r.entry), 2) + "x" : "-", fixed(r.seconds, 1)});
    }
    print_table(table);
    std::printf("%zu keys: %d cached, %d tuned, %d tuned by another process, %d busy, %d failed; NVRTC compiled %llu "
                "kernel variants, %llu came from the cache\n",
                rows.size(), outcomes["cached"], outcomes["tuned"], outcomes["tuned by another process"],
                outcomes["busy"], outcomes["failed"], static_cast<unsigned long long>(k.compiled.load()),
                static_cast<unsigned long long>(k.kernels_from_cache.load()));
    for (const auto& r : rows) {
      if (r.outcome == "failed" || r.outcome == "busy")
        std::fprintf(stderr, "gnsilu-tune: %s: %s\n", key_text(r.key).c_str(), r.message.c_str());
    }
  }
  return ok ? kOk : kFailed;
}

int run_compile(const CompileOptions& o) {
  // Every dtype pair in every layout and activation asked for (all by default), checked before anything else.
  std::vector<KernelForm> forms;
  const auto layouts = layouts_of(o.layouts);
  const auto activations = activations_of(o.activations);
  for (const auto& p : o.dtypes.empty() ? all_pairs() : pairs_of(o.dtypes)) {
    for (Layout l : layouts)
      for (Activation a : activations) add_unique(forms, {p, l, a});
  }
  use_cache_file(cache_path(o.common.cache));
  std::vector<int> archs = archs_of(o.archs);
  std::string reason;
  if (archs.empty()) {
    std::string why;
    auto gpu = GpuSession::open(o.device, why);
    if (!gpu) throw CliError(kUsage, "no GPU here (" + why + "): name the architectures with --arch (like 90)");
    archs.push_back(gpu->info().arch());
  }
  return compile_only(archs, forms, o.common, reason);
}

int run_list(const Common& o) {
  const std::string path = cache_path(o.cache);
  std::vector<cache::TuningEntry> entries;
  int64_t kernels = 0;
  if (!path.empty() && file_exists(path)) {
    auto store = open_for_reading(path);
    entries = store->all_tuning();
    kernels = store->kernel_count();
    if (!store->usable()) throw CliError(kBadInput, path + ": " + store->problem());
  }
  if (o.json) {
    json list = json::array();
    for (std::size_t i = 0; i < entries.size(); ++i) list.push_back(entry_summary_json(entries[i], i + 1));
    print_json({{"cache", path}, {"exists", !path.empty() && file_exists(path)}, {"entries", list}, {"kernels", kernels}});
    return kOk;
  }
  if (path.empty() || !file_exists(path)) {
    std::printf("%s: no cache file yet (nothing tuned)\n", path.empty() ? "(cache off)" : path.c_str());
    return kOk;
  }
  std::vector<std::vector<std::string>> table{
      {"#", "device", "cpg", "dtypes", "layout", "activation", "class", "winner", "us", "speedup", "age", "state"}};
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    table.push_back({std::to_string(i + 1), e.key.device.name + " sm" + std::to_string(e.key.device.arch),
                     std::to_string(e.key.channels_per_group), pair_text(e.key.x_dtype, e.key.y_dtype),
                     layout_name(e.key.layout), activation_name(e.key.activation), e.key.size_class,
                     config_text(e.winner), fixed(e.best_us, 1), fixed(speedup(e), 2) + "x", age_text(e.created_at),
                     e.key.code_version == detail::code_version() ? "current" : "stale (prune removes)"});
  }
  print_table(table);
  std::printf("%zu tuned entries, %lld compiled kernels in %s\n", entries.size(), static_cast<long long>(kernels),
              path.c_str());
  return kOk;
}

int run_show(const ShowOptions& o) {
  const std::string path = cache_path(o.common.cache);
  const auto entries = entries_of(path);
  if (o.id < 1 || static_cast<std::size_t>(o.id) > entries.size()) {
    throw CliError(kUsage, "entry " + std::to_string(o.id) + " does not exist: " + path + " holds " +
                               std::to_string(entries.size()) + " entries (see gnsilu-tune list)");
  }
  const auto& e = entries[static_cast<std::size_t>(o.id - 1)];
  if (o.common.json) {
    json doc = entry_summary_json(e, static_cast<std::size_t>(o.id));
    json cands = json::array();
    for (const auto& c : e.candidates) cands.push_back(cache::candidate_json(c));
    doc["candidates"] = cands;
    print_json(doc);
    return kOk;
  }
  std::printf("entry %d of %s\n  key:        %s\n  layout:     %s\n  activation: %s\n  code:       %s (%s)\n"
              "  device:     %s, sm_%d, %d SMs, %lld MiB, L2 %d KiB\n"
              "  winner:     %s at %.2f us; default %.2f us (%.2fx); noise %.2f us\n  tuned on:   %s, %s ago, gnsilu %s\n",
              o.id, path.c_str(), key_text(e.key).c_str(), layout_text(e.key.layout).c_str(),
              activation_text(e.key.activation).c_str(), e.key.code_version.c_str(),
              e.key.code_version == detail::code_version() ? "current" : "stale", e.key.device.name.c_str(),
              e.key.device.arch, e.key.device.sms, static_cast<long long>(e.key.device.memory_mib), e.key.device.l2_kib,
              config_text(e.winner).c_str(), e.best_us, e.default_us, speedup(e), e.noise_us, e.tuned_shape.text().c_str(),
              age_text(e.created_at).c_str(), e.library_version.c_str());
  std::vector<std::vector<std::string>> table{{"  candidate", "median us", "noise us", "samples", "status"}};
  auto sorted = e.candidates;
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return (a.median_us > 0 ? a.median_us : 1e300) < (b.median_us > 0 ? b.median_us : 1e300);
  });
  for (const auto& c : sorted) {
    table.push_back({"  " + config_text(c.config) + (c.config == e.winner ? " *" : ""), fixed(c.median_us, 2),
                     fixed(c.noise_us, 2), std::to_string(c.samples), c.status});
  }
  print_table(table);
  return kOk;
}

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
  if (o.common.json) {
    print_json({{"exported", o.file}, {"from", path}, {"entries", bundle.tuning.size()}, {"kernels", bundle.kernels.size()}});
  } else {
    std::printf("exported %zu tuned entries and %zu compiled kernels from %s to %s\n", bundle.tuning.size(),
                bundle.kernels.size(), path.c_str(), o.file.c_str());
  }
  return kOk;
}

namespace {

cache::Bundle read_input(const std::string& file, bool with_kernels) {
  try {
    return cache::read_bundle(file, with_kernels);
  } catch (const cache::TransferError& e) {
    throw CliError(kBadInput, e.what());
  }
}

// A cached kernel against its rebuild: NVRTC gives the same bytes for the same source, options and NVRTC
// version (the code version holds all three), so any difference means the bytes were not made by this source.
struct KernelCheck {
  cache::KernelKey key;
  std::string status;  // "same", "differs", "other kernel version", "unknown variant", "compile failed: ..."
};

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

void print_report(const cache::MergeReport& r, const std::string& verb) {
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
    if (!o.common.json && !o.common.quiet)
      std::printf("verified %zu kernels: each the same bytes as its rebuild\n", checks.size());
  }
  const std::string path = cache_path(o.common.cache);
  auto store = open_for_writing(path);
  cache::MergeReport r;
  try {
    r = cache::merge_into(*store, bundle, o.dry_run);
  } catch (const cache::TransferError& e) {
    throw CliError(kBadInput, e.what());
  }
  if (o.common.json) {
    json doc = report_json(r);
    doc["into"] = path;
    doc["from"] = o.file;
    doc["dry_run"] = o.dry_run;
    doc["skipped_mismatched"] = {{"entries", refused.tuning.size()}, {"kernels", refused.kernels.size()}};
    print_json(doc);
  } else {
    print_report(r, std::string(o.dry_run ? "would import" : "imported") + " " + o.file + " into " + path);
    if (!refused.tuning.empty() || !refused.kernels.empty()) {
      std::printf("skipped %zu entries and %zu kernels made for another device or kernel version\n",
                  refused.tuning.size(), refused.kernels.size());
    }
  }
  return kOk;
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
  if (o.common.json) {
    json doc = report_json(total);
    doc["into"] = o.file;
    doc["inputs"] = o.inputs;
    doc["entries"] = merged.tuning.size();
    doc["kernels"] = merged.kernels.size();
    print_json(doc);
  } else {
    print_report(total, "merged " + std::to_string(o.inputs.size()) + " files into " + o.file);
  }
  return kOk;
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
  const int same = count_status(checks, "same"), differ = count_status(checks, "differs");
  const int other = count_status(checks, "other kernel version");
  const int failed = static_cast<int>(checks.size()) - same - differ - other;
  if (o.common.json) {
    json list = json::array();
    for (const auto& c : checks)
      list.push_back({{"arch", c.key.arch}, {"code_version", c.key.code_version}, {"variant", c.key.variant},
                      {"status", c.status}});
    print_json({{"cache", path}, {"kernels", list}, {"same", same}, {"differ", differ},
                {"other_kernel_version", other}, {"not_rebuilt", failed}});
  } else {
    for (const auto& c : checks)
      if (c.status != "same") std::printf("%s  sm_%d %s\n", c.status.c_str(), c.key.arch, c.key.variant.c_str());
    std::printf("%zu kernels in %s: %d the same bytes as their rebuild, %d differ, %d of another kernel version "
                "(not rebuilt), %d could not be rebuilt\n", checks.size(), path.c_str(), same, differ, other, failed);
  }
  return differ > 0 ? kKernelDiffers : failed > 0 ? kFailed : kOk;
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
  if (o.common.json) {
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
    print_json({{"cache", path},
                {"device", device_json(*gpu)},
                {"tolerance", o.tolerance},
                {"entries", list},
                {"other_entries", entries.size() - mine.size()},
                {"drifted", drifted},
                {"failed", failed}});
  } else {
    std::vector<std::vector<std::string>> table{{"status", "key", "layout", "activation", "winner", "cached us", "now us",
                                                 "drift", "default now us", "winner/default now"}};
    for (const auto& r : rows) {
      table.push_back({r.status.substr(0, 40), key_text(r.entry.key, false), layout_name(r.entry.key.layout),
                       activation_name(r.entry.key.activation), config_text(r.entry.winner),
                       fixed(r.entry.best_us, 1), fixed(r.winner_us, 1), fixed(100 * r.drift, 1) + "%",
                       fixed(r.default_us, 1), r.default_us > 0 ? fixed(r.winner_us / r.default_us, 3) : "-"});
    }
    print_table(table);
    std::printf("%zu entries re-timed on %s (%zu others are for other devices or kernel versions): %d drifted by more "
                "than %.0f%%, %d failed\n",
                rows.size(), gpu->info().name.c_str(), entries.size() - mine.size(), drifted, 100 * o.tolerance, failed);
  }
  if (failed > 0) return kFailed;
  return o.strict && drifted > 0 ? kDrift : kOk;
}

int run_prune(const TransferOptions& o) {
  const std::string path = cache_path(o.common.cache);
  if (!file_exists(path)) throw CliError(kBadInput, path + ": no such cache file");
  auto store = o.dry_run ? open_for_reading(path) : open_for_writing(path);
  const std::string current = detail::code_version();
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
  if (o.common.json) {
    print_json({{"cache", path}, {"dry_run", o.dry_run}, {"entries_removed", entries}, {"kernels_removed", kernels},
                {"code_version", current}});
  } else {
    std::printf("%s %d tuned entries and %d compiled kernels of other kernel versions from %s (current: %s)\n",
                o.dry_run ? "would remove" : "removed", entries, kernels, path.c_str(), current.c_str());
  }
  return kOk;
}

int run_report(const ReportOptions& o) {
  std::string format = o.format;
  if (format.empty()) format = o.output.ends_with(".svg") ? "svg" : "html";
  if (format != "html" && format != "svg") throw CliError(kUsage, "--format must be html or svg");
  const std::string path = cache_path(o.common.cache);
  const auto entries = entries_of(path);
  const std::string title = "gnsilu tuning report: " + path;
  const std::string text = format == "svg" ? report_svg(entries, title) : report_html(entries, title);
  std::ofstream out(o.output, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw CliError(kFailed, o.output + ": cannot be written");
  if (o.common.json) {
    print_json({{"report", o.output}, {"format", format}, {"entries", entries.size()}});
  } else {
    std::printf("wrote %s (%s, %zu keys)\n", o.output.c_str(), format.c_str(), entries.size());
  }
  return kOk;
}

}  // namespace gnsilu::tune
