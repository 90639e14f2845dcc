// The export format's JSON, written and read (export_format.hpp).
#include "cache/transfer/export_format.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "cache/transfer/base64.hpp"
#include "base/launch_config.hpp"
#include "base/names.hpp"

namespace gnsilu::cache {
namespace {

using nlohmann::json;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::string checksum_of(const KernelImage& image) {
  return kernel_checksum(image.image, join_lowered_names(image.lowered_names));
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
          {"image", detail::base64_encode(k.image.image)},
          {"checksum", checksum_of(k.image)}};
}

// Field access that names what is wrong.
class Reader {
 public:
  explicit Reader(std::string what) : what_(std::move(what)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& problem) const {
    throw TransferError(what_, where + ": " + problem);
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
  // A field holding one of an enum's names, read with its parser from base/names.hpp (`names` says which names
  // are valid); where `absent` is given, a missing field reads as it.
  template <typename Enum>
  Enum named(const json& object, const char* name, const std::string& where,
             std::optional<Enum> (*parse)(std::string_view), const char* names,
             std::optional<Enum> absent = std::nullopt) const {
    if (absent && object.is_object() && !object.contains(name)) return *absent;
    const std::string s = text(object, name, where);
    const std::optional<Enum> value = parse(s);
    if (!value) fail(where + "." + name, "\"" + s + "\" is not " + names);
    return *value;
  }
  DType dtype(const json& object, const char* name, const std::string& where) const {
    return named(object, name, where, &detail::dtype_from_name, "bf16, fp16 or fp32");
  }
  // A key's layout or activation: absent in export files written before keys had them (format version 1),
  // where every entry was channels-first GroupNorm+SiLU; required from version 2.
  Layout layout(const json& object, const std::string& where, bool required) const {
    return named(object, "layout", where, &detail::layout_from_name, "nchw or nhwc",
                 required ? std::nullopt : std::optional(Layout::ChannelsFirst));
  }
  Activation activation(const json& object, const std::string& where, bool required) const {
    return named(object, "activation", where, &detail::activation_from_name, "silu or none",
                 required ? std::nullopt : std::optional(Activation::SiLU));
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
    t.groups = integer(object, "tuned_groups", where, 0, kInt64Max);
    t.path = named(object, "path", where, &detail::path_from_name, "fused, split or auto");
    return t;
  }
  LaunchConfig config(const json& object, const char* name, const std::string& where) const {
    const json& v = field(object, name, where);
    const std::string here = where + "." + name;
    LaunchConfig c;
    c.elems_per_load = static_cast<int>(integer(v, "elems_per_load", here, 0, kIntMax));
    c.warps = static_cast<int>(integer(v, "warps", here, 0, kIntMax));
    c.stages = static_cast<int>(integer(v, "stages", here, 0, kIntMax));
    c.programs_per_sm = static_cast<int>(integer(v, "programs_per_sm", here, 0, kIntMax));
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
  TuningEntry e;
  const json& key = r.field(j, "key", where);
  const std::string kw = where + ".key";
  const json& dev = r.field(key, "device", kw);
  const std::string dw = kw + ".device";
  e.key.device.name = r.text(dev, "name", dw);
  e.key.device.arch = static_cast<int>(r.integer(dev, "arch", dw, 1, kIntMax));
  e.key.device.sms = static_cast<int>(r.integer(dev, "sms", dw, 1, kIntMax));
  e.key.device.memory_mib = r.integer(dev, "memory_mib", dw, 0, kInt64Max);
  e.key.device.l2_kib = static_cast<int>(r.integer(dev, "l2_kib", dw, 0, kIntMax));
  e.key.code_version = r.text(key, "code_version", kw);
  e.key.channels_per_group = r.integer(key, "channels_per_group", kw, 1, kInt64Max);
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
  e.created_at = r.integer(j, "created_at", where, 0, kInt64Max);
  const json& cands = r.field(j, "candidates", where);
  if (!cands.is_array()) r.fail(where + ".candidates", "is not an array");
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const std::string cw = where + ".candidates[" + std::to_string(i) + "]";
    CandidateTiming c;
    c.config = r.config(cands[i], "config", cw);
    c.median_us = r.number(cands[i], "median_us", cw);
    c.noise_us = r.number(cands[i], "noise_us", cw);
    c.samples = static_cast<int>(r.integer(cands[i], "samples", cw, 0, kIntMax));
    c.status = r.text(cands[i], "status", cw);
    e.candidates.push_back(std::move(c));
  }
  return e;
}

KernelRecord parse_kernel(const Reader& r, const json& j, const std::string& where) {
  KernelRecord k;
  k.key.arch = static_cast<int>(r.integer(j, "arch", where, 1, kIntMax));
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
  if (!detail::base64_decode(r.text(j, "image", where), k.image.image) || k.image.image.empty()) {
    r.fail(where + ".image", "is not base64 of a kernel image");
  }
  if (r.text(j, "checksum", where) != checksum_of(k.image)) {
    r.fail(where, "the kernel image does not match its checksum (damaged)");
  }
  return k;
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
  if (doc.is_discarded()) throw TransferError(what, "is not JSON (nor a SQLite cache file)");
  const Reader r(what);
  if (!doc.is_object() || !doc.contains("format") || doc["format"] != kExportFormat) {
    throw TransferError(what, "is not a gnsilu cache export (no \"format\": \"" + std::string(kExportFormat) + "\")");
  }
  const int64_t v = r.integer(doc, "format_version", "document", 0, kIntMax);
  if (v < 1 || v > kExportVersion) {
    throw TransferError(what, "export format version " + std::to_string(v) + "; this gnsilu reads versions 1 to " +
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

}  // namespace gnsilu::cache
