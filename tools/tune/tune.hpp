// gnsilu-tune: what the subcommands share. Exit codes (documented in --help and the README), the error that
// carries one, the cache file a command works on, and output helpers (JSON on stdout, a progress line on a
// terminal, plain lines when piped).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache/entries.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/plan.hpp"

namespace gnsilu::tune {

enum Exit : int {
  kOk = 0,
  kFailed = 1,     // a GPU, driver or compiler failure, or a key that could not be tuned
  kUsage = 2,      // bad command-line arguments
  kBadInput = 3,   // an input file or cache file that cannot be read or used
  kRefused = 4,    // import refused: device or kernel version mismatch (see --force / --skip-mismatched)
  kNoGpu = 5,      // the command needs a GPU and there is none
  kDrift = 6,      // verify --strict: a cached winner's time moved by more than the tolerance
  kKernelDiffers = 7,  // verify --kernels / import --verify-kernels: a kernel's bytes differ from its rebuild
  // 130 / 143: interrupted by SIGINT / SIGTERM (128 + the signal), after releasing this process's tuning leases
};

constexpr const char* kExitCodesHelp =
    "Exit codes: 0 success, 1 GPU/driver/compiler failure or a key not tuned, 2 bad arguments, 3 unreadable or "
    "unusable input or cache file, 4 import refused (device or kernel version mismatch), 5 no GPU, 6 drift "
    "beyond the tolerance (verify --strict), 7 a cached kernel differs from its rebuild (verify --kernels, import "
    "--verify-kernels), 130 / 143 interrupted by SIGINT / SIGTERM (its tuning leases released, "
    "the cache file consistent).";

// A failure that ends the command with `code` and one line on stderr.
class CliError : public std::runtime_error {
 public:
  CliError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// One activation to tune for: shape (N, C, *spatial), groups, the dtype pair, the memory layout (x's and y's)
// and what follows the normalization (SiLU, or none: plain GroupNorm).
struct ShapeRequest {
  std::vector<int64_t> shape;
  int64_t groups = 32;
  DType x = DType::BF16;
  DType y = DType::BF16;
  Layout layout = Layout::ChannelsFirst;
  Activation activation = Activation::SiLU;
  std::string origin;  // "command line", "flux decoder", "shapes.json[3]"
};

struct DTypePair {
  DType x = DType::BF16;
  DType y = DType::BF16;
  friend bool operator==(const DTypePair&, const DTypePair&) = default;
};

// Appends `pair` unless `pairs` holds it already.
void add_unique(std::vector<DTypePair>& pairs, DTypePair pair);

// The geometry of a request (in its layout: ChannelsFirst where both layouts are the same memory);
// CliError(kUsage) naming the request, its shape and groups when they do not fit.
detail::Geometry geometry_of(const ShapeRequest& request);

// "nchw" (also channels_first, channels-first, ncdhw) or "nhwc" (channels_last, channels-last, ndhwc), and "silu" or
// "none". `option` names where the text came from in the error (CliError(kUsage)): "--layout", "--activation".
Layout parse_layout(const std::string& text, const std::string& option = "--layout");
Activation parse_activation(const std::string& text, const std::string& option = "--activation");
// Each text parsed, duplicates dropped, in the order given; CliError(kUsage) naming `option` when empty.
std::vector<Layout> layouts_of(const std::vector<std::string>& texts, const std::string& option = "--layout");
std::vector<Activation> activations_of(const std::vector<std::string>& texts,
                                       const std::string& option = "--activation");

// "1x512x128x128" (throws CliError(kUsage) naming the text).
std::vector<int64_t> parse_shape(const std::string& text);
std::string shape_text(const std::vector<int64_t>& shape);
// "bf16" or "bf16:fp32" (x:y).
DTypePair parse_dtype_pair(const std::string& text);
std::string pair_text(DType x, DType y);
// "1024" or "720x1280" (height x width).
void parse_resolution(const std::string& text, int64_t& height, int64_t& width);

struct PresetOptions {
  int64_t height = 0;  // 0: the preset's default
  int64_t width = 0;
  int64_t frames = 0;  // video presets; 0: the preset's default
  int64_t batch = 1;
  std::string part = "both";  // decoder | encoder | both
};

// The names of the built-in presets, and the GroupNorm inputs of a preset's VAE (groups 32), without dtypes or
// layouts: those of GroupNorm+SiLU (activation SiLU) and the plain GroupNorm of the mid block's attention
// (activation None). Throws CliError(kUsage) for an unknown name or options that do not fit it.
std::vector<std::string> preset_names();
std::vector<ShapeRequest> preset_shapes(const std::string& name, const PresetOptions& options);

// What a shape request is made in when it does not say: every dtype pair, layout and activation listed.
struct Forms {
  std::vector<DTypePair> pairs;
  std::vector<Layout> layouts;
  std::vector<Activation> activations;
};

// Shapes from a JSON file: {"shapes": [...]} or a top-level array; each item "1x512x64x64" or
// {"shape": [1, 512, 64, 64], "groups": 32, "dtypes": ["bf16", "fp16:fp32"], "layouts": ["nhwc"],
// "activations": ["silu", "none"]}. What an item does not list comes from `defaults`. Throws
// CliError(kBadInput) naming the file and the item.
std::vector<ShapeRequest> shapes_from_json(const std::string& path, const Forms& defaults);

// Appends `base` once in each of the forms (dtype pair x layout x activation, in that nesting) to `out`.
void add_each_form(const ShapeRequest& base, const Forms& forms, std::vector<ShapeRequest>& out);

// The cache file a command works on: --cache, else GNSILU_CACHE, else the default user file.
std::string cache_path(const std::string& option);

// (JSON of keys and configurations: cache::key_json and cache::config_json, the export format's.)
std::string config_text(const LaunchConfig& config);  // "e16 w8 s1 p4"
// "NVIDIA H200 sm90 | cpg16 bf16>bf16 nhwc silu | dram-split"; without `form`, the layout and the activation are
// left out (for tables that give them columns of their own).
std::string key_text(const cache::TuningKey& key, bool form = true);
// "nhwc (channels-last)", "none (plain GroupNorm)": what list and show print.
std::string layout_text(Layout layout);
std::string activation_text(Activation activation);

// Progress over a known number of steps: a redrawn bar with ETA on a terminal (stderr), plain lines when piped.
// Silent when `enabled` is false.
class Progress {
 public:
  Progress(std::size_t total, bool enabled);
  ~Progress();
  void step(const std::string& line);  // one step done; `line` says what happened
  void note(const std::string& line);  // a line that is not a step

 private:
  void draw(const std::string& current);
  std::size_t total_;
  std::size_t done_ = 0;
  bool enabled_;
  bool terminal_;
  double started_;
};

// Prints `rows` as an aligned text table (first row: the header) to stdout.
void print_table(const std::vector<std::vector<std::string>>& rows);

// `v` with `digits` decimals: "12.35".
std::string fixed(double v, int digits);

// Printing once: a subcommand computes one typed result, builds from it the document that --json prints and the
// function that prints its text, and emit prints one of the two: the document (on stdout) when `json`, else
// text(). Both are made from the same typed values; the text never reads the document back. Returns `code` (the
// command's exit code).
using PrintText = std::function<void()>;
int emit(bool json, const nlohmann::json& result, const PrintText& text, int code = kOk);

}  // namespace gnsilu::tune
