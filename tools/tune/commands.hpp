// The subcommands of gnsilu-tune, each a function of its options returning the exit code (errors: CliError).
// Each computes one result document and prints it once through emit (tune.hpp): as JSON with --json, else as text.
// commands_warm.cpp: warm, compile; commands_inspect.cpp: list, show; commands_transfer.cpp: export, import,
// merge, prune; commands_verify.cpp: verify (and --kernels); report.cpp: report. What they share:
// commands_common.hpp.
#pragma once

#include <string>
#include <vector>

#include "tune.hpp"

namespace gnsilu::tune {

struct Common {
  std::string cache;  // --cache (empty: GNSILU_CACHE or the default user file)
  bool json = false;  // --json: one JSON document on stdout
  bool quiet = false; // --quiet: no progress lines
};

struct WarmOptions {
  Common common;
  std::vector<std::string> shapes;
  std::vector<std::string> presets;
  std::vector<std::string> shape_files;
  std::vector<std::string> dtypes{"bf16", "fp16"};
  std::vector<std::string> layouts{"nchw", "nhwc"};
  std::vector<std::string> activations;  // empty: silu for shapes, what the model applies for presets
  int64_t groups = 32;
  std::string resolution;
  PresetOptions preset;
  bool retune = false;
  bool compile_only = false;
  std::vector<std::string> archs;  // spellings: 90, sm_90, sm90, compute_90, 9.0 (archs.hpp)
  int device = 0;
  double wait = 600.0;  // --wait SECONDS: patience with another process tuning the same key (--no-wait: 0)
};

struct CompileOptions {
  Common common;
  std::vector<std::string> archs;  // spellings as for WarmOptions
  std::vector<std::string> dtypes;  // empty: all nine pairs
  std::vector<std::string> layouts{"nchw", "nhwc"};
  std::vector<std::string> activations{"silu", "none"};
  int device = 0;
};

struct ShowOptions {
  Common common;
  int id = 0;  // show: the row number of list
};

struct TransferOptions {
  Common common;
  std::string file;                 // export: output; import: input
  std::vector<std::string> inputs;  // merge
  bool no_kernels = false;
  bool force = false;
  bool skip_mismatched = false;
  bool dry_run = false;
  bool verify_kernels = false;  // import --verify-kernels: rebuild every kernel first, refuse on a difference
  int device = 0;
};

struct VerifyOptions {
  Common common;
  double tolerance = 0.10;
  int samples = 25;
  bool strict = false;
  bool kernels = false;  // --kernels: rebuild every cached kernel with NVRTC and compare bytes (no GPU)
  int device = 0;
};

struct ReportOptions {
  Common common;
  std::string output;
  std::string format;  // html | svg (empty: from the file name)
};

int run_warm(const WarmOptions& o);
int run_compile(const CompileOptions& o);
int run_list(const Common& o);
int run_show(const ShowOptions& o);
int run_export(const TransferOptions& o);
int run_import(const TransferOptions& o);
int run_merge(const TransferOptions& o);
int run_verify(const VerifyOptions& o);
int run_prune(const TransferOptions& o);
int run_report(const ReportOptions& o);

}  // namespace gnsilu::tune
