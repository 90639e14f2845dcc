// NVRTC: compiles the embedded kernel sources to a CUBIN for one architecture (or to PTX when the device is
// newer than this NVRTC knows), instantiating the requested kernel templates by name expression.
#pragma once

#include <string>
#include <vector>

namespace gnsilu::detail {

struct CompileRequest {
  int arch = 90;                             // compute capability * 10 (75, 80, 86, 89, 90, ...)
  std::vector<std::string> names;            // name expressions, e.g. "gnsilu::kernel::finalize<8>"
  std::vector<std::string> extra_options;    // appended to the fixed options (e.g. "--ptxas-options=-v")
  // Empty: the library's kernels (group_norm_silu.cu). Else a program of its own (a test's), compiled with every
  // kernel file available to #include, group_norm_silu.cu too.
  std::string source;
  // PTX for the architecture's virtual target even where NVRTC could make a CUBIN: NVRTC's front end alone, without
  // ptxas (the compile guard measures the two apart; the library never asks for it).
  bool ptx_only = false;
};

struct CompiledProgram {
  int arch = 0;
  bool is_cubin = true;                      // false: PTX for the driver to compile
  std::vector<char> image;                   // CUBIN or NUL-terminated PTX
  std::vector<std::string> lowered_names;    // mangled names, one per requested name
  std::string log;                           // NVRTC's log (ptxas' report with --ptxas-options=-v)
  std::string options;                       // the options used, space-separated
};

// Throws CompileError (with the log and options) when NVRTC fails.
CompiledProgram compile(const CompileRequest& request);

// The options every compile uses for `arch`: IEEE arithmetic, no contraction (fma only where written).
std::vector<std::string> fixed_options(int arch, bool cubin);

// Architectures this NVRTC can emit CUBIN for (compute capability * 10), ascending.
const std::vector<int>& supported_archs();

// "13.0" style NVRTC version.
std::string nvrtc_version();

}  // namespace gnsilu::detail
