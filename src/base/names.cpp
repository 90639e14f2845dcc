// The names of the public enums and the version: public API functions (gnsilu.hpp) that every layer uses to
// name things in keys, messages and files, so they live at the bottom of the library.
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
