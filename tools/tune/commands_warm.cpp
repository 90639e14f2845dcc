// gnsilu-tune warm and compile: tuning the keys of shapes on a GPU, or compiling kernel variants without one.
#include <algorithm>
#include <cstdio>
#include <map>
#include <type_traits>

#include "archs.hpp"
#include "commands.hpp"
#include "commands_common.hpp"
#include "gpu.hpp"
#include "base/counters.hpp"
#include "cache/transfer/transfer.hpp"
#include "runtime/kernels.hpp"

namespace gnsilu::tune {
namespace {

using nlohmann::json;
using cache::config_json;
using cache::key_json;

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
  std::vector<ShapeRequest> out;
  for (const auto& s : o.shapes) {
    ShapeRequest r;
    r.shape = parse_shape(s);
    r.groups = o.groups;
    r.origin = "command line";
    add_each_form(r, forms, out);
  }
  PresetOptions preset = o.preset;
  if (!o.resolution.empty()) parse_resolution(o.resolution, preset.height, preset.width);
  if (preset.batch <= 0) throw CliError(kUsage, "--batch must be positive");
  for (const auto& p : o.presets) {
    for (const auto& r : preset_shapes(p, preset)) {
      const bool asked = o.activations.empty() ||
                         std::find(forms.activations.begin(), forms.activations.end(), r.activation) !=
                             forms.activations.end();
      if (asked) add_each_form(r, {forms.pairs, forms.layouts, {r.activation}}, out);
    }
  }
  for (const auto& f : o.shape_files) {
    for (auto& r : shapes_from_json(f, forms)) out.push_back(std::move(r));
  }
  if (out.empty()) throw CliError(kUsage, "nothing to warm: give shapes (like 1x512x128x128), --preset or --shapes-file");
  for (const auto& r : out) geometry_of(r);  // every request checked before any work
  return out;
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

template <class T>
std::string joined(const std::vector<T>& list, const char* separator, const char* prefix = "") {
  std::string out;
  for (const auto& x : list) {
    if (!out.empty()) out += separator;
    out += prefix;
    if constexpr (std::is_same_v<T, std::string>) out += x;
    else out += std::to_string(x);
  }
  return out;
}

int compile_only(const std::vector<int>& archs, const std::vector<KernelForm>& forms, const Common& c,
                 const std::string& reason) {
  for (int a : archs) {
    if (a < 75) throw CliError(kUsage, "--arch " + std::to_string(a) + ": gnsilu needs compute capability 7.5 or newer (75)");
  }
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
  const unsigned long long compiled = k.compiled.load(), from_cache = k.kernels_from_cache.load();
  const std::string cache = cache_path(c.cache);
  // The text of compile (and of warm without a GPU).
  const auto text = [&] {
    std::printf("%zu kernel variants for %s (%s; %s; %s): %llu compiled, %llu already in the cache (%s)\n", variants,
                joined(archs, ", ", "sm_").c_str(), joined(dtypes, ",").c_str(), joined(layouts, ",").c_str(),
                joined(activations, ",").c_str(), compiled, from_cache, cache.empty() ? "cache off" : cache.c_str());
  };
  return emit(c.json,
              {{"mode", "compile"},
               {"archs", archs},
               {"dtypes", dtypes},
               {"layouts", layouts},
               {"activations", activations},
               {"cache", cache},
               {"variants", variants},
               {"compiled", compiled},
               {"from_cache", from_cache},
               {"note", reason}},
              text);
}

// The counts of warm's summary.
struct WarmSummary {
  int cached = 0, tuned = 0, elsewhere = 0, busy = 0, failed = 0;
  unsigned long long compiled = 0, kernels_from_cache = 0;
};

// The text of warm on a GPU: a row per key, the summary, and a line on stderr per key failed or busy.
void warm_text(const std::vector<WarmRow>& rows, const WarmSummary& s) {
  std::vector<std::vector<std::string>> table{
      {"outcome", "key", "layout", "activation", "winner", "us", "default us", "speedup", "s"}};
  for (const auto& row : rows) {
    const auto& e = row.entry;
    table.push_back({outcome_name(row.outcome), key_text(row.key, false), layout_name(row.key.layout),
                     activation_name(row.key.activation), e ? config_text(e->winner) : "-",
                     e ? fixed(e->best_us, 1) : "-", e ? fixed(e->default_us, 1) : "-",
                     e ? fixed(speedup(*e), 2) + "x" : "-", fixed(row.seconds, 1)});
  }
  print_table(table);
  std::printf("%zu keys: %d cached, %d tuned, %d tuned by another process, %d busy, %d failed; NVRTC compiled %llu "
              "kernel variants, %llu came from the cache\n",
              rows.size(), s.cached, s.tuned, s.elsewhere, s.busy, s.failed, s.compiled, s.kernels_from_cache);
  using O = detail::WarmResult::Outcome;
  for (const auto& row : rows) {
    if (row.outcome == O::Failed || row.outcome == O::HeldByOther) {
      std::fprintf(stderr, "gnsilu-tune: %s: %s\n", key_text(row.key).c_str(), row.message.c_str());
    }
  }
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

  std::vector<WarmRow> keyed = keys_of(*gpu, requests);  // each key computed once, carried by its row
  const std::size_t keys = keyed.size();
  Progress progress(keys, !o.common.quiet && !o.common.json);
  progress.note("warming " + std::to_string(keys) + " tuning keys (" + std::to_string(requests.size()) +
                " shapes) on " + gpu->info().name + " into " + (path.empty() ? "memory (cache off)" : path));
  const auto rows = warm(*gpu, std::move(keyed), o.retune, o.wait, progress);
  using O = detail::WarmResult::Outcome;
  std::map<O, int> outcomes;
  for (const auto& r : rows) outcomes[r.outcome]++;
  const auto& k = detail::counters();
  json list = json::array();
  for (const auto& r : rows) {
    json row = {{"key", key_json(r.key)},   {"outcome", outcome_name(r.outcome)},         {"shape", shape_text(r.request.shape)},
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
  const bool ok = outcomes[O::Failed] == 0 && outcomes[O::HeldByOther] == 0;
  const WarmSummary summary{outcomes[O::Cached],      outcomes[O::Tuned],
                            outcomes[O::TunedElsewhere], outcomes[O::HeldByOther],
                            outcomes[O::Failed] + outcomes[O::NotFound], k.compiled.load(),
                            k.kernels_from_cache.load()};
  return emit(o.common.json,
              {{"mode", "tune"},
               {"device", device_json(*gpu)},
               {"cache", path},
               {"keys", list},
               {"summary",
                {{"keys", rows.size()},
                 {"cached", summary.cached},
                 {"tuned", summary.tuned},
                 {"tuned_by_another_process", summary.elsewhere},
                 {"busy", summary.busy},
                 {"failed", summary.failed},
                 {"compiled", summary.compiled},
                 {"kernels_from_cache", summary.kernels_from_cache}}}},
              [&] { warm_text(rows, summary); }, ok ? kOk : kFailed);
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

}  // namespace gnsilu::tune
