#include "cache/transfer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/launch_config.hpp"
#include "cache/store.hpp"

namespace gnsilu::cache {
namespace {

using nlohmann::json;

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(const std::vector<char>& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
                       static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
                       static_cast<unsigned char>(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kBase64[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kBase64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// Returns false for anything that is not canonical base64 of whole bytes.
bool base64_decode(const std::string& text, std::vector<char>& out) {
  std::array<int, 256> value{};
  value.fill(-1);
  for (int i = 0; i < 64; ++i) value[static_cast<unsigned char>(kBase64[i])] = i;
  if (text.size() % 4 != 0) return false;
  out.clear();
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = text[i + static_cast<std::size_t>(j)];
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        v[j] = 0;
        ++pad;
      } else if (pad > 0 || (v[j] = value[static_cast<unsigned char>(c)]) < 0) {
        return false;
      }
    }
    const uint32_t n = static_cast<uint32_t>(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2) out.push_back(static_cast<char>(n >> 8 & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xFF));
  }
  return true;
}

json entry_json(const TuningEntry& e) {
  json candidates = json::array();
  for (const auto& c : e.candidates) candidates.push_back(candidate_json(c));
  return {{"key", key_json(e.key)},
          {"winner", config_json(e.winner)},
          {"default_us", e.default_us},
          {"best_us", e.best_us},
          {"noise_us", e.noise_us},
          {"tuned_shape", e.tuned_shape.text()},
          {"tuned_dims", e.tuned_shape.dims},
          {"tuned_groups", e.tuned_shape.groups},
          {"path", path_name(e.tuned_shape.path)},
          {"library_version", e.library_version},
          {"created_at", e.created_at},
          {"candidates", candidates}};
}

json kernel_json(const KernelRecord& k) {
  return {{"arch", k.key.arch},
          {"code_version", k.key.code_version},
          {"variant", k.key.variant},
          {"is_cubin", k.image.is_cubin},
          {"options", k.image.options},
          {"nvrtc_version", k.image.nvrtc_version},
          {"lowered_names", k.image.lowered_names},
          {"image", base64_encode(k.image.image)},
          {"checksum", kernel_checksum(k.image.image, join_lowered_names(k.image.lowered_names))}};
}

// Field access that names what is wrong.
class Reader {
 public:
  explicit Reader(std::string what) : what_(std::move(what)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& problem) const {
    throw TransferError(what_ + ": " + where + ": " + problem);
  }
  const json& field(const json& object, const char* name, const std::string& where) const {
    if (!object.is_object()) fail(where, "is not an object");
    auto it = object.find(name);
    if (it == object.end()) fail(where, std::string("has no \"") + name + "\"");
    return *it;
  }
  std::string text(const json& object, const char* name, const std::string& where) const {
    const json& v = field(object, name, where);
    if (!v.is_string()) fail(where + "." + name, "is not a string");
    return v.get<std::string>();
  }
  int64_t integer(const json& object, const char* name, const std::string& where, int64_t lo, int64_t hi) const {
    const json& v = field(object, name, where);
    if (!v.is_number_integer()) fail(where + "." + name, "is not an integer");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail(where + "." + name, std::to_string(x) + " is out of range");
    return x;
  }
  double number(const json& object, const char* name, const std::string& where) const {
    const json& v = field(object, name, where);
    if (!v.is_number()) fail(where + "." + name, "is not a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0) fail(where + "." + name, "is not a finite non-negative number");
    return x;
  }
  DType dtype(const json& object, const char* name, const std::string& where) const {
    const std::string s = text(object, name, where);
    const DType d = dtype_from_name(s);
    if (d == DType::None) fail(where + "." + name, "\"" + s + "\" is not bf16, fp16 or fp32");
    return d;
  }
  // A key's layout or activation: absent in export files written before keys had them (format version 1),
  // where every entry was channels-first GroupNorm+SiLU; required from version 2.
  Layout layout(const json& object, const std::string& where, bool required) const {
    if (!required && object.is_object() && !object.contains("layout")) return Layout::ChannelsFirst;
    const std::string s = text(object, "layout", where);
    Layout l = Layout::ChannelsFirst;
    if (!layout_from_name(s, l)) fail(where + ".layout", "\"" + s + "\" is not nchw or nhwc");
    return l;
  }
  Activation activation(const json& object, const std::string& where, bool required) const {
    if (!required && object.is_object() && !object.contains("activation")) return Activation::SiLU;
    const std::string s = text(object, "activation", where);
    Activation a = Activation::SiLU;
    if (!activation_from_name(s, a)) fail(where + ".activation", "\"" + s + "\" is not silu or none");
    return a;
  }
  // What an entry was tuned on: "tuned_dims", "tuned_groups" and "path" where the file has them (written since
  // schema 4); otherwise (files written before) read once from "tuned_shape" and the key's size class.
  TunedShape tuned_shape(const json& object, const std::string& where, const std::string& size_class) const {
    if (!object.is_object() || !object.contains("tuned_dims")) {
      return tuned_shape_from_legacy(text(object, "tuned_shape", where), size_class);
    }
    TunedShape t;
    const json& dims = field(object, "tuned_dims", where);
    if (!dims.is_array()) fail(where + ".tuned_dims", "is not an array");
    for (const auto& d : dims) {
      if (!d.is_number_integer() || d.get<int64_t>() < 1) {
        fail(where + ".tuned_dims", "holds something other than positive whole numbers");
      }
      t.dims.push_back(d.get<int64_t>());
    }
    t.groups = integer(object, "tuned_groups", where, 0, std::numeric_limits<int64_t>::max());
    const std::string p = text(object, "path", where);
    if (!path_from_name(p, t.path)) fail(where + ".path", "\"" + p + "\" is not fused, split or auto");
    return t;
  }
  LaunchConfig config(const json& object, const char* name, const std::string& where) const {
    const json& v = field(object, name, where);
    const std::string here = where + "." + name;
    constexpr int64_t big = std::numeric_limits<int>::max();
    LaunchConfig c;
    c.elems_per_load = static_cast<int>(integer(v, "elems_per_load", here, 0, big));
    c.warps = static_cast<int>(integer(v, "warps", here, 0, big));
    c.stages = static_cast<int>(integer(v, "stages", here, 0, big));
    c.programs_per_sm = static_cast<int>(integer(v, "programs_per_sm", here, 0, big));
    try {
      detail::check_config(c);
    } catch (const std::exception& e) {
      fail(here, e.what());
    }
    return c;
  }

 private:
  std::string what_;
};

TuningEntry parse_entry(const Reader& r, const json& j, const std::string& where, int64_t version) {
  constexpr int64_t big = std::numeric_limits<int>::max();
  TuningEntry e;
  const json& key = r.field(j, "key", where);
  const std::string kw = where + ".key";
  const json& dev = r.field(key, "device", kw);
  const std::string dw = kw + ".device";
  e.key.device.name = r.text(dev, "name", dw);
  e.key.device.arch = static_cast<int>(r.integer(dev, "arch", dw, 1, big));
  e.key.device.sms = static_cast<int>(r.integer(dev, "sms", dw, 1, big));
  e.key.device.memory_mib = r.integer(dev, "memory_mib", dw, 0, std::numeric_limits<int64_t>::max());
  e.key.device.l2_kib = static_cast<int>(r.integer(dev, "l2_kib", dw, 0, big));
  e.key.code_version = r.text(key, "code_version", kw);
  e.key.channels_per_group = r.integer(key, "channels_per_group", kw, 1, std::numeric_limits<int64_t>::max());
  e.key.x_dtype = r.dtype(key, "x_dtype", kw);
  e.key.y_dtype = r.dtype(key, "y_dtype", kw);
  e.key.size_class = r.text(key, "size_class", kw);
  e.key.layout = r.layout(key, kw, version >= 2);
  e.key.activation = r.activation(key, kw, version >= 2);
  e.winner = r.config(j, "winner", where);
  e.default_us = r.number(j, "default_us", where);
  e.best_us = r.number(j, "best_us", where);
  e.noise_us = r.number(j, "noise_us", where);
  e.tuned_shape = r.tuned_shape(j, where, e.key.size_class);
  e.library_version = r.text(j, "library_version", where);
  e.created_at = r.integer(j, "created_at", where, 0, std::numeric_limits<int64_t>::max());
  const json& cands = r.field(j, "candidates", where);
  if (!cands.is_array()) r.fail(where + ".candidates", "is not an array");
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const std::string cw = where + ".candidates[" + std::to_string(i) + "]";
    CandidateTiming c;
    c.config = r.config(cands[i], "config", cw);
    c.median_us = r.number(cands[i], "median_us", cw);
    c.noise_us = r.number(cands[i], "noise_us", cw);
    c.samples = static_cast<int>(r.integer(cands[i], "samples", cw, 0, big));
    c.status = r.text(cands[i], "status", cw);
    e.candidates.push_back(std::move(c));
  }
  return e;
}

KernelRecord parse_kernel(const Reader& r, const json& j, const std::string& where) {
  KernelRecord k;
  k.key.arch = static_cast<int>(r.integer(j, "arch", where, 1, std::numeric_limits<int>::max()));
  k.key.code_version = r.text(j, "code_version", where);
  k.key.variant = r.text(j, "variant", where);
  const json& cubin = r.field(j, "is_cubin", where);
  if (!cubin.is_boolean()) r.fail(where + ".is_cubin", "is not true or false");
  k.image.is_cubin = cubin.get<bool>();
  k.image.options = r.text(j, "options", where);
  k.image.nvrtc_version = r.text(j, "nvrtc_version", where);
  const json& names = r.field(j, "lowered_names", where);
  if (!names.is_array() || names.empty()) r.fail(where + ".lowered_names", "is not a non-empty array");
  for (const auto& n : names) {
    if (!n.is_string()) r.fail(where + ".lowered_names", "holds something other than strings");
    k.image.lowered_names.push_back(n.get<std::string>());
  }
  if (!base64_decode(r.text(j, "image", where), k.image.image) || k.image.image.empty()) {
    r.fail(where + ".image", "is not base64 of a kernel image");
  }
  if (r.text(j, "checksum", where) != kernel_checksum(k.image.image, join_lowered_names(k.image.lowered_names))) {
    r.fail(where, "the kernel image does not match its checksum (damaged)");
  }
  return k;
}

int ok_candidates(const TuningEntry& e) {
  int n = 0;
  for (const auto& c : e.candidates) n += c.status == "ok";
  return n;
}

bool same_measurement(const TuningEntry& a, const TuningEntry& b) {
  return a.winner == b.winner && a.best_us == b.best_us && a.default_us == b.default_us &&
         a.noise_us == b.noise_us && a.created_at == b.created_at;
}

bool same_kernel(const KernelImage& a, const KernelImage& b) {
  return a.image == b.image && a.lowered_names == b.lowered_names && a.is_cubin == b.is_cubin;
}

}  // namespace

json key_json(const TuningKey& k) {
  const auto& d = k.device;
  return {{"device", {{"name", d.name}, {"arch", d.arch}, {"sms", d.sms}, {"memory_mib", d.memory_mib},
                      {"l2_kib", d.l2_kib}}},
          {"code_version", k.code_version},
          {"channels_per_group", k.channels_per_group},
          {"x_dtype", dtype_name(k.x_dtype)},
          {"y_dtype", dtype_name(k.y_dtype)},
          {"layout", layout_name(k.layout)},
          {"activation", activation_name(k.activation)},
          {"size_class", k.size_class}};
}

json config_json(const LaunchConfig& c) {
  return {{"elems_per_load", c.elems_per_load}, {"warps", c.warps}, {"stages", c.stages},
          {"programs_per_sm", c.programs_per_sm}};
}

json candidate_json(const CandidateTiming& c) {
  return {{"config", config_json(c.config)}, {"median_us", c.median_us}, {"noise_us", c.noise_us},
          {"samples", c.samples}, {"status", c.status}};
}

Bundle bundle_of(Store& store, bool with_kernels, bool untrusted_kernels) {
  Bundle b;
  b.tuning = store.all_tuning();
  if (with_kernels) {
    for (const auto& key : store.kernel_keys()) {
      if (auto image = untrusted_kernels ? store.read_kernel(key) : store.find_kernel(key))
        b.kernels.push_back({key, std::move(*image)});
    }
  }
  return b;
}

std::string export_text(const Bundle& bundle) {
  json tuning = json::array();
  for (const auto& e : bundle.tuning) tuning.push_back(entry_json(e));
  json kernels = json::array();
  for (const auto& k : bundle.kernels) kernels.push_back(kernel_json(k));
  const json doc = {{"format", kExportFormat},
                    {"format_version", kExportVersion},
                    {"library_version", version()},
                    {"tuning", tuning},
                    {"kernels", kernels}};
  return doc.dump(1) + "\n";
}

Bundle parse_export(std::string_view text, const std::string& what) {
  const json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw TransferError(what + ": is not JSON (nor a SQLite cache file)");
  const Reader r(what);
  if (!doc.is_object() || !doc.contains("format") || doc["format"] != kExportFormat) {
    throw TransferError(what + ": is not a gnsilu cache export (no \"format\": \"" + std::string(kExportFormat) +
                        "\")");
  }
  const int64_t v = r.integer(doc, "format_version", "document", 0, std::numeric_limits<int>::max());
  if (v < 1 || v > kExportVersion) {
    throw TransferError(what + ": export format version " + std::to_string(v) + "; this gnsilu reads versions 1 to " +
                        std::to_string(kExportVersion));
  }
  Bundle b;
  const json& tuning = r.field(doc, "tuning", "document");
  if (!tuning.is_array()) r.fail("tuning", "is not an array");
  for (std::size_t i = 0; i < tuning.size(); ++i) {
    b.tuning.push_back(parse_entry(r, tuning[i], "tuning[" + std::to_string(i) + "]", v));
  }
  const json& kernels = r.field(doc, "kernels", "document");
  if (!kernels.is_array()) r.fail("kernels", "is not an array");
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    b.kernels.push_back(parse_kernel(r, kernels[i], "kernels[" + std::to_string(i) + "]"));
  }
  return b;
}

Bundle read_bundle(const std::string& path, bool with_kernels, bool untrusted_kernels) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TransferError(path + ": cannot be opened for reading");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw TransferError(path + ": read failed");
  constexpr std::string_view kSqliteMagic("SQLite format 3\0", 16);
  if (text.size() >= kSqliteMagic.size() && std::string_view(text).substr(0, kSqliteMagic.size()) == kSqliteMagic) {
    // A file of an older schema is read through an upgraded copy in memory: an input is never changed.
    const auto store = Store::read_upgraded(path);
    if (!store->usable()) throw TransferError(path + ": " + store->problem());
    Bundle b = bundle_of(*store, with_kernels, untrusted_kernels);
    if (!store->usable()) throw TransferError(path + ": " + store->problem());
    return b;
  }
  Bundle b = parse_export(text, path);
  if (!with_kernels) b.kernels.clear();
  return b;
}

void write_export(const Bundle& bundle, const std::string& path) {
  const std::string text = export_text(bundle);
  const std::string temp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) throw TransferError(path + ": cannot be created (" + temp + " could not be opened for writing)");
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      out.close();
      std::remove(temp.c_str());
      throw TransferError(path + ": writing failed (disk full?)");
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    throw TransferError(path + ": cannot be replaced (rename failed)");
  }
}

bool better_measured(const TuningEntry& a, const TuningEntry& b) {
  const int ok_a = ok_candidates(a), ok_b = ok_candidates(b);
  if (ok_a != ok_b) return ok_a > ok_b;
  auto relative_noise = [](const TuningEntry& e) {
    return e.best_us > 0 ? e.noise_us / e.best_us : std::numeric_limits<double>::infinity();
  };
  const double na = relative_noise(a), nb = relative_noise(b);
  if (na != nb) return na < nb;
  return a.created_at > b.created_at;
}

MergeReport merge(Bundle& into, const Bundle& incoming) {
  MergeReport report;
  for (const auto& e : incoming.tuning) {
    auto it = std::find_if(into.tuning.begin(), into.tuning.end(), [&](const TuningEntry& x) { return x.key == e.key; });
    if (it == into.tuning.end()) {
      into.tuning.push_back(e);
      ++report.added;
    } else if (same_measurement(*it, e)) {
      ++report.identical;
    } else if (better_measured(e, *it)) {
      report.conflicts.push_back({e.key, e.winner, it->winner, true});
      *it = e;
      ++report.replaced;
    } else {
      report.conflicts.push_back({e.key, it->winner, e.winner, false});
      ++report.kept;
    }
  }
  for (const auto& k : incoming.kernels) {
    auto it = std::find_if(into.kernels.begin(), into.kernels.end(),
                           [&](const KernelRecord& x) { return x.key == k.key; });
    if (it == into.kernels.end()) {
      into.kernels.push_back(k);
      ++report.kernels_added;
    } else if (same_kernel(it->image, k.image)) {
      ++report.kernels_identical;
    } else {
      // Same sources, options and NVRTC version give the same code; a difference means another NVRTC build.
      it->image = k.image;
      ++report.kernels_replaced;
    }
  }
  return report;
}

MergeReport merge_into(Store& store, const Bundle& incoming, bool dry_run) {
  if (!store.usable()) throw TransferError(store.path() + ": " + store.problem());
  if (!dry_run && !store.writable()) throw TransferError(store.path() + ": " + store.problem());
  // Merge against what the store holds for the incoming keys, then write only what changed.
  Bundle current;
  for (const auto& e : incoming.tuning) {
    if (auto existing = store.find_tuning(e.key)) current.tuning.push_back(std::move(*existing));
  }
  for (const auto& k : incoming.kernels) {
    if (auto existing = store.find_kernel(k.key)) current.kernels.push_back({k.key, std::move(*existing)});
  }
  if (!store.usable()) throw TransferError(store.path() + ": " + store.problem());
  Bundle merged = current;
  MergeReport report = merge(merged, incoming);
  if (dry_run) return report;
  for (const auto& e : merged.tuning) {
    auto before = std::find_if(current.tuning.begin(), current.tuning.end(),
                               [&](const TuningEntry& x) { return x.key == e.key; });
    if (before != current.tuning.end() && same_measurement(*before, e)) continue;
    if (!store.put_tuning(e)) throw TransferError(store.path() + ": " + store.problem());
  }
  for (const auto& k : merged.kernels) {
    auto before = std::find_if(current.kernels.begin(), current.kernels.end(),
                               [&](const KernelRecord& x) { return x.key == k.key; });
    if (before != current.kernels.end() && same_kernel(before->image, k.image)) continue;
    if (!store.put_kernel(k.key, k.image)) throw TransferError(store.path() + ": " + store.problem());
  }
  return report;
}

Bundle take_mismatched(Bundle& bundle, const std::optional<DeviceIdentity>& device, const std::string& code_version) {
  Bundle out;
  std::vector<TuningEntry> keep;
  for (auto& e : bundle.tuning) {
    const bool usable = e.key.code_version == code_version && (!device || e.key.device == *device);
    (usable ? keep : out.tuning).push_back(std::move(e));
  }
  bundle.tuning = std::move(keep);
  std::vector<KernelRecord> keep_kernels;
  for (auto& k : bundle.kernels) {
    const bool usable = k.key.code_version == code_version && (!device || k.key.arch == device->arch);
    (usable ? keep_kernels : out.kernels).push_back(std::move(k));
  }
  bundle.kernels = std::move(keep_kernels);
  return out;
}

}  // namespace gnsilu::cache
