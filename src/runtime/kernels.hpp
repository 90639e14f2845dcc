// The kernel variants: which template instances one (x dtype, y dtype, launch configuration) needs, and
// compiling them. A variant is one NVRTC program with seven kernels (chunk_stats, finalize, apply, fused,
// apply_padded, and chunk_stats and apply for calls with an input bias).
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/launch_config.hpp"  // check_config, to_string (used with variants everywhere)
#include "runtime/compiler.hpp"
#include "gnsilu/gnsilu.hpp"

namespace gnsilu::detail {

struct Variant {
  DType x_dtype = DType::BF16;
  DType y_dtype = DType::BF16;
  LaunchConfig config;
  Layout layout = Layout::ChannelsFirst;  // the kernels' memory layout (x and y alike)
  Activation activation = Activation::SiLU;
  friend bool operator==(const Variant&, const Variant&) = default;
};

// kStatsBiased and kApplyBiased: chunk_stats and apply for calls with an input bias (instances of their own, so that
// a call without one runs code compiled as if the bias did not exist).
enum KernelIndex : int {
  kStats = 0,
  kFinalize = 1,
  kApply = 2,
  kFused = 3,
  kApplyPadded = 4,
  kStatsBiased = 5,
  kApplyBiased = 6,
  kKernelCount = 7
};

// The name expressions of a variant's kernels, in KernelIndex order.
std::array<std::string, kKernelCount> kernel_names(const Variant& variant);

// Compiles the variants (all into one program) for `arch`.
CompiledProgram compile_variants(int arch, std::span<const Variant> variants,
                                 const std::vector<std::string>& extra_options = {});

// "bf16->fp16 nhwc silu e16 w8 s1 p4" for logs and reports.
std::string describe(const Variant& variant);

// What a variant's compiled code is, for the compiled-kernel cache: "bf16-fp16-e16-w8-s1-nhwc-silu"
// (programs_per_sm is a grid size and does not change the code).
std::string code_name(const Variant& variant);
// The inverse of code_name (programs_per_sm left at its default), or nullopt for a name it does not write.
std::optional<Variant> variant_of_code_name(const std::string& name);

// A version of the compiled code: the kernel sources (SHA-256 at build time), the fixed compile options and
// the NVRTC version, hashed. Part of every cache key.
const std::string& code_version();

}  // namespace gnsilu::detail
