// The public enums' names (gnsilu.hpp: dtype_name, layout_name, activation_name, path_name) read back: each parser
// is the inverse of its name function over the enum's values, so the two cannot disagree, and anything else (other
// spellings, other case, the empty string) is nullopt. Every reader of names uses these: the cache's rows, export
// files, gnsilu-tune and gnsilu-bench.
#pragma once

#include <optional>
#include <string_view>

#include "gnsilu/gnsilu.hpp"

namespace gnsilu::detail {

std::optional<DType> dtype_from_name(std::string_view name);            // "bf16", "fp16", "fp32"
std::optional<Layout> layout_from_name(std::string_view name);          // "nchw", "nhwc"
std::optional<Activation> activation_from_name(std::string_view name);  // "silu", "none"
std::optional<Path> path_from_name(std::string_view name);              // "auto", "fused", "split"

}  // namespace gnsilu::detail
