// Shapes to tune for: parsed from the command line, read from JSON files, or taken from the built-in VAE presets.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <tuple>

#include "base/names.hpp"
#include "tune.hpp"

namespace gnsilu::tune {
namespace {

int64_t parse_positive(const std::string& text, const std::string& what) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    throw CliError(kUsage, what + ": \"" + text + "\" is not a positive whole number");
  }
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v <= 0) throw CliError(kUsage, what + ": \"" + text + "\" is out of range");
  return v;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

DType parse_dtype(const std::string& text) {
  const auto d = detail::dtype_from_name(text);
  if (!d) throw CliError(kUsage, "dtype \"" + text + "\" is not bf16, fp16 or fp32");
  return *d;
}

// A 2-D AutoencoderKL (Flux, SD3, SDXL): block channels 128, 256, 512, 512; the decoder's up blocks have three
// resnets each, the first of which may change the channel count. Returns (channels, height divisor) pairs.
using Level = std::tuple<int64_t, int64_t, int64_t>;  // channels, spatial divisor, frames (0: image)

std::vector<Level> image_vae_levels(bool encoder, bool decoder) {
  std::vector<Level> levels;
  if (encoder) {
    // down blocks at 1, 1/2, 1/4, 1/8: resnets of 128, 128->256, 256->512, 512; mid block and norm_out at 1/8.
    levels.insert(levels.end(), {{128, 1, 0}, {128, 2, 0}, {256, 2, 0}, {256, 4, 0}, {512, 4, 0}, {512, 8, 0}});
  }
  if (decoder) {
    // mid block and up block 0 at 1/8, up 1 at 1/4, up 2 (512->256) at 1/2, up 3 (256->128) and norm_out at 1.
    levels.insert(levels.end(), {{512, 8, 0}, {512, 4, 0}, {512, 2, 0}, {256, 2, 0}, {256, 1, 0}, {128, 1, 0}});
  }
  return levels;
}

}  // namespace

std::vector<int64_t> parse_shape(const std::string& text) {
  std::string problem;
  const auto shape = cache::shape_from_text(text, &problem);
  if (!shape) throw CliError(kUsage, "shape " + text + ": " + problem);
  if (shape->size() < 2) throw CliError(kUsage, "shape " + text + ": needs at least N and C (like 1x512x128x128)");
  return *shape;
}

std::string shape_text(const std::vector<int64_t>& shape) { return cache::shape_to_text(shape); }

DTypePair parse_dtype_pair(const std::string& text) {
  const auto parts = split(text, ':');
  if (parts.size() > 2) throw CliError(kUsage, "dtype \"" + text + "\": use X or X:Y (like bf16 or bf16:fp32)");
  DTypePair p;
  p.x = parse_dtype(parts[0]);
  p.y = parts.size() == 2 ? parse_dtype(parts[1]) : p.x;
  return p;
}

void add_unique(std::vector<DTypePair>& pairs, DTypePair pair) {
  if (std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) pairs.push_back(pair);
}

detail::Geometry geometry_of(const ShapeRequest& r) {
  try {
    return detail::make_geometry(r.shape, r.groups, r.layout);
  } catch (const Error& e) {
    throw CliError(kUsage, r.origin + ": " + shape_text(r.shape) + " with " + std::to_string(r.groups) +
                               " groups: " + e.what());
  }
}

Layout parse_layout(const std::string& text, const std::string& option) {
  if (const auto layout = detail::layout_from_name(text)) return *layout;
  if (text == "channels_first" || text == "channels-first" || text == "ncdhw") return Layout::ChannelsFirst;
  if (text == "channels_last" || text == "channels-last" || text == "ndhwc") return Layout::ChannelsLast;
  throw CliError(kUsage, option + ": layout \"" + text + "\" is not nchw (channels_first) or nhwc (channels_last)");
}

Activation parse_activation(const std::string& text, const std::string& option) {
  if (const auto activation = detail::activation_from_name(text)) return *activation;
  throw CliError(kUsage, option + ": activation \"" + text + "\" is not silu or none");
}

std::vector<Layout> layouts_of(const std::vector<std::string>& texts, const std::string& option) {
  std::vector<Layout> out;
  for (const auto& t : texts) {
    const Layout l = parse_layout(t, option);
    if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
  }
  if (out.empty()) throw CliError(kUsage, option + ": give at least one layout (nchw, nhwc)");
  return out;
}

std::vector<Activation> activations_of(const std::vector<std::string>& texts, const std::string& option) {
  std::vector<Activation> out;
  for (const auto& t : texts) {
    const Activation a = parse_activation(t, option);
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  if (out.empty()) throw CliError(kUsage, option + ": give at least one activation (silu, none)");
  return out;
}

std::string pair_text(DType x, DType y) {
  return x == y ? dtype_name(x) : std::string(dtype_name(x)) + ":" + dtype_name(y);
}

void parse_resolution(const std::string& text, int64_t& height, int64_t& width) {
  const auto parts = split(text, 'x');
  if (parts.size() > 2) throw CliError(kUsage, "resolution \"" + text + "\": use 1024 or HEIGHTxWIDTH");
  height = parse_positive(parts[0], "resolution");
  width = parts.size() == 2 ? parse_positive(parts[1], "resolution") : height;
}

std::vector<std::string> preset_names() { return {"flux", "sd3", "sdxl", "hunyuan-video"}; }

std::vector<ShapeRequest> preset_shapes(const std::string& name, const PresetOptions& o) {
  const auto names = preset_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw CliError(kUsage, "preset \"" + name + "\" is unknown (presets: " + list + ")");
  }
  if (o.part != "decoder" && o.part != "encoder" && o.part != "both") {
    throw CliError(kUsage, "--part must be decoder, encoder or both, not \"" + o.part + "\"");
  }
  const bool encoder = o.part != "decoder", decoder = o.part != "encoder";
  const bool video = name == "hunyuan-video";
  const int64_t height = o.height ? o.height : (video ? 720 : 1024);
  const int64_t width = o.width ? o.width : (video ? 1280 : 1024);
  if (height % 8 != 0 || width % 8 != 0) {
    throw CliError(kUsage, "preset " + name + ": the resolution must be a multiple of 8 (the VAE's downsampling)");
  }
  std::vector<ShapeRequest> out;
  auto add = [&](std::vector<int64_t> shape, const std::string& part, Activation activation = Activation::SiLU) {
    ShapeRequest r;
    r.shape = std::move(shape);
    r.groups = 32;
    r.activation = activation;
    r.origin = name + " " + part;
    out.push_back(std::move(r));
  };
  if (!video) {
    if (o.frames > 1) throw CliError(kUsage, "preset " + name + " is an image VAE: --frames does not apply");
    // The mid block's attention (diffusers' Attention with norm_num_groups=32) normalizes the mid block's
    // activation, 512 channels at 1/8, with a plain nn.GroupNorm: once in the encoder, once in the decoder.
    const std::vector<int64_t> attention = {o.batch, 512, height / 8, width / 8};
    if (encoder) {
      for (const auto& [c, div, unused] : image_vae_levels(true, false)) add({o.batch, c, height / div, width / div}, "encoder");
      add(attention, "encoder attention", Activation::None);
    }
    if (decoder) {
      for (const auto& [c, div, unused] : image_vae_levels(false, true)) add({o.batch, c, height / div, width / div}, "decoder");
      add(attention, "decoder attention", Activation::None);
    }
    return out;
  }
  // Hunyuan Video's causal 3-D VAE: the same channels, 8x spatial and 4x temporal compression (time halves at
  // the second and third down blocks, keeping the first frame: F -> (F - 1) / 2 + 1).
  const int64_t frames = o.frames ? o.frames : 33;
  if ((frames - 1) % 4 != 0) throw CliError(kUsage, "preset hunyuan-video: --frames must be 4k + 1 (like 33 or 129)");
  const int64_t f1 = (frames - 1) / 2 + 1, f2 = (frames - 1) / 4 + 1;
  const std::vector<Level> enc = {{128, 1, frames}, {128, 2, frames}, {256, 2, frames}, {256, 4, f1},
                                  {512, 4, f1},     {512, 8, f2}};
  const std::vector<Level> dec = {{512, 8, f2}, {512, 4, f2}, {512, 2, f1}, {256, 2, f1},
                                  {256, 1, frames}, {128, 1, frames}};
  // The mid block's attention (HunyuanVideoMidBlock3D) group-normalizes its input, 512 channels at 1/8 and the
  // fewest frames, with no activation: diffusers flattens it to (N, F*H*W, C) first, so the GroupNorm sees that
  // activation channels-last in memory (the nhwc keys; which layouts are warmed is --layout's choice).
  const std::vector<int64_t> attention = {o.batch, 512, f2, height / 8, width / 8};
  if (encoder) {
    for (const auto& [c, div, f] : enc) add({o.batch, c, f, height / div, width / div}, "encoder");
    add(attention, "encoder attention", Activation::None);
  }
  if (decoder) {
    for (const auto& [c, div, f] : dec) add({o.batch, c, f, height / div, width / div}, "decoder");
    add(attention, "decoder attention", Activation::None);
  }
  return out;
}

std::vector<ShapeRequest> shapes_from_json(const std::string& path, const Forms& defaults) {
  std::ifstream in(path);
  if (!in) throw CliError(kBadInput, path + ": cannot be opened");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) throw CliError(kBadInput, path + ": is not JSON");
  const nlohmann::json* items = &doc;
  if (doc.is_object()) {
    auto it = doc.find("shapes");
    if (it == doc.end()) throw CliError(kBadInput, path + ": has no \"shapes\" array");
    items = &*it;
  }
  if (!items->is_array()) throw CliError(kBadInput, path + ": \"shapes\" is not an array");
  std::vector<ShapeRequest> out;
  for (std::size_t i = 0; i < items->size(); ++i) {
    const auto& item = (*items)[i];
    const std::string where = path + " item " + std::to_string(i);
    ShapeRequest base;
    base.origin = path + "[" + std::to_string(i) + "]";
    std::vector<DTypePair> pairs = defaults.pairs;
    std::vector<Layout> layouts = defaults.layouts;
    std::vector<Activation> activations = defaults.activations;
    try {
      if (item.is_string()) {
        base.shape = parse_shape(item.get<std::string>());
      } else if (item.is_object() && item.contains("shape") && item["shape"].is_array()) {
        for (const auto& d : item["shape"]) {
          if (!d.is_number_integer() || d.get<int64_t>() <= 0) throw CliError(kBadInput, "shape sizes must be positive integers");
          base.shape.push_back(d.get<int64_t>());
        }
        if (base.shape.size() < 2) throw CliError(kBadInput, "shape needs at least N and C");
        if (item.contains("groups")) {
          if (!item["groups"].is_number_integer() || item["groups"].get<int64_t>() <= 0)
            throw CliError(kBadInput, "groups must be a positive integer");
          base.groups = item["groups"].get<int64_t>();
        }
        if (item.contains("dtypes")) {
          if (!item["dtypes"].is_array()) throw CliError(kBadInput, "dtypes must be an array of strings");
          pairs.clear();
          for (const auto& d : item["dtypes"]) {
            if (!d.is_string()) throw CliError(kBadInput, "dtypes must be an array of strings");
            pairs.push_back(parse_dtype_pair(d.get<std::string>()));
          }
        }
        auto texts_of = [&](const char* name) {
          const auto& list = item[name];
          const std::string bad = std::string(name) + " must be a non-empty array of strings";
          if (!list.is_array() || list.empty()) throw CliError(kBadInput, bad);
          std::vector<std::string> texts;
          for (const auto& t : list) {
            if (!t.is_string()) throw CliError(kBadInput, bad);
            texts.push_back(t.get<std::string>());
          }
          return texts;
        };
        if (item.contains("layouts")) layouts = layouts_of(texts_of("layouts"), "layouts");
        if (item.contains("activations")) activations = activations_of(texts_of("activations"), "activations");
      } else {
        throw CliError(kBadInput, "is neither \"NxCxHxW\" nor an object with a \"shape\" array");
      }
    } catch (const CliError& e) {
      throw CliError(kBadInput, where + ": " + e.what());
    }
    add_each_form(base, {pairs, layouts, activations}, out);
  }
  return out;
}

void add_each_form(const ShapeRequest& base, const Forms& forms, std::vector<ShapeRequest>& out) {
  for (const auto& p : forms.pairs) {
    for (Layout l : forms.layouts) {
      for (Activation a : forms.activations) {
        ShapeRequest r = base;
        r.x = p.x;
        r.y = p.y;
        r.layout = l;
        r.activation = a;
        out.push_back(std::move(r));
      }
    }
  }
}

}  // namespace gnsilu::tune
