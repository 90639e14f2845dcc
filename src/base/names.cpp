// The names of the public enums and the version: public API functions (gnsilu.hpp) that every layer uses to
// name things in keys, messages and files, so they live at the bottom of the library; and their parsers
// (names.hpp), side by side.
#include "base/names.hpp"

#include <initializer_list>

#include "gnsilu/gnsilu.hpp"

#ifndef GNSILU_VERSION_STRING
#define GNSILU_VERSION_STRING "0.0.0"
#endif

namespace gnsilu {

const char* version() { return GNSILU_VERSION_STRING; }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::BF16: return "bf16";
    case DType::FP16: return "fp16";
    case DType::FP32: return "fp32";
    case DType::None: return "none";
  }
  return "unknown";
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::ChannelsFirst: return "nchw";
    case Layout::ChannelsLast: return "nhwc";
  }
  return "unknown";
}

const char* activation_name(Activation activation) {
  switch (activation) {
    case Activation::SiLU: return "silu";
    case Activation::None: return "none";
  }
  return "unknown";
}

const char* path_name(Path path) {
  switch (path) {
    case Path::Auto: return "auto";
    case Path::Fused: return "fused";
    case Path::Split: return "split";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::BF16:
    case DType::FP16: return 2;
    case DType::FP32: return 4;
    default: return 0;
  }
}

}  // namespace gnsilu

namespace gnsilu::detail {
namespace {

template <typename E, typename NameOf>
std::optional<E> parse_name(std::string_view name, std::initializer_list<E> values, NameOf name_of) {
  for (E value : values)
    if (name == name_of(value)) return value;
  return std::nullopt;
}

}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  return parse_name(name, {DType::BF16, DType::FP16, DType::FP32}, dtype_name);
}

std::optional<Layout> layout_from_name(std::string_view name) {
  return parse_name(name, {Layout::ChannelsFirst, Layout::ChannelsLast}, layout_name);
}

std::optional<Activation> activation_from_name(std::string_view name) {
  return parse_name(name, {Activation::SiLU, Activation::None}, activation_name);
}

std::optional<Path> path_from_name(std::string_view name) {
  return parse_name(name, {Path::Auto, Path::Fused, Path::Split}, path_name);
}

}  // namespace gnsilu::detail
