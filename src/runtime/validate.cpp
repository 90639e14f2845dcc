#include "runtime/validate.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include "base/errors.hpp"

namespace gnsilu::detail {
namespace {

bool tensor_dtype(DType d) { return d == DType::BF16 || d == DType::FP16 || d == DType::FP32; }

void check_tensor_dtype(const char* name, DType d) {
  if (!tensor_dtype(d)) {
    throw_invalid(name, "unknown dtype " + std::to_string(static_cast<int>(d)) + " (expected BF16=1, FP16=2 or FP32=3)");
  }
}

void check_parameter_dtype(const char* name, const void* pointer, DType d) {
  if (pointer == nullptr) return;  // absent: dtype ignored
  if (!tensor_dtype(d)) {
    throw_invalid(name, "unknown dtype " + std::to_string(static_cast<int>(d)) +
                            " for a non-null pointer (expected BF16=1, FP16=2 or FP32=3)");
  }
}

void check_alignment(const char* name, const void* pointer, DType d) {
  const std::size_t size = dtype_size(d);
  if (pointer != nullptr && size != 0 && reinterpret_cast<std::uintptr_t>(pointer) % size != 0) {
    throw_invalid(name, "is not aligned to its element size (" + std::to_string(size) + " bytes)");
  }
}

void check_layout(const char* name, Layout layout) {
  if (layout != Layout::ChannelsFirst && layout != Layout::ChannelsLast) {
    throw_invalid(name, "unknown layout " + std::to_string(static_cast<int>(layout)) +
                            " (expected CHANNELS_FIRST=0 or CHANNELS_LAST=1)");
  }
}

}  // namespace

Geometry validate_problem(const Problem& p) {
  if (p.x == nullptr) throw_invalid("x", "is null");
  if (p.y == nullptr) throw_invalid("y", "is null");
  check_tensor_dtype("x_dtype", p.x_dtype);
  check_tensor_dtype("y_dtype", p.y_dtype);
  check_parameter_dtype("weight_dtype", p.weight, p.weight_dtype);
  check_parameter_dtype("bias_dtype", p.bias, p.bias_dtype);
  check_alignment("x", p.x, p.x_dtype);
  check_alignment("y", p.y, p.y_dtype);
  check_alignment("weight", p.weight, p.weight_dtype);
  check_alignment("bias", p.bias, p.bias_dtype);
  check_alignment("input_bias", p.input_bias, p.x_dtype);
  if (!(p.eps > 0.0) || !std::isfinite(p.eps)) {
    throw_invalid("eps", "must be a finite number > 0, got " + std::to_string(p.eps));
  }
  check_layout("x_layout", p.x_layout);
  check_layout("y_layout", p.y_layout);
  if (p.activation != Activation::SiLU && p.activation != Activation::None) {
    throw_invalid("activation", "unknown activation " + std::to_string(static_cast<int>(p.activation)) +
                                    " (expected SILU=0 or NONE=1)");
  }
  Geometry g = make_geometry(p.shape, p.num_groups, p.x_layout);
  add_padding(g, p.shape, p.pad, p.pad_mode, p.pad_value, p.y_layout);
  g.biased = p.input_bias != nullptr;
  // Where the two layouts are the same memory (g.layout is then ChannelsFirst), any pair is fine.
  if (p.y_layout != p.x_layout && g.s != 1 && g.c != 1) {
    throw_invalid("y_layout", std::string("is ") + layout_name(p.y_layout) + " but x_layout is " +
                                  layout_name(p.x_layout) + "; gnsilu writes y in x's layout");
  }
  return g;
}

// The statistics of a region read x, its shape, groups, layout and input bias only.
// An empty region (no element: a tile that owns nothing) may have a null x; its records are zeros.
Geometry validate_stats_problem(const Problem& p) {
  check_tensor_dtype("x_dtype", p.x_dtype);
  check_alignment("x", p.x, p.x_dtype);
  check_alignment("input_bias", p.input_bias, p.x_dtype);
  check_layout("x_layout", p.x_layout);
  const Geometry g = make_geometry(p.shape, p.num_groups, p.x_layout);
  if (p.x == nullptr && g.numel != 0) throw_invalid("x", "is null");
  return g;
}

}  // namespace gnsilu::detail
