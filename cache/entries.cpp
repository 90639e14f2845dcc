#include "cache/entries.hpp"

#include <cstdio>
#include <string>

namespace gnsilu::cache {

std::string TuningKey::text() const {
  return device.name + "|sm" + std::to_string(device.arch) + "|" + std::to_string(device.sms) + "sm|" +
         std::to_string(device.memory_mib) + "MiB|" + std::to_string(device.l2_kib) + "KiB|" + code_version + "|cpg" +
         std::to_string(channels_per_group) + "|" + dtype_name(x_dtype) + ">" + dtype_name(y_dtype) + "|" +
         layout_name(layout) + "|" + activation_name(activation) + "|" + size_class;
}

std::string size_class_of(std::size_t bytes, std::size_t l2_bytes, std::string_view path) {
  // Activations whose x and y fit in L2 run from cache on repeated calls; larger ones stream from DRAM.
  return std::string(bytes <= l2_bytes ? "l2-" : "dram-") + std::string(path);
}

std::string kernel_checksum(const std::vector<char>& image, const std::string& joined_names) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](char c) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  };
  for (char c : image) mix(c);
  for (char c : joined_names) mix(c);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

DType dtype_from_name(const std::string& name) {
  if (name == "bf16") return DType::BF16;
  if (name == "fp16") return DType::FP16;
  if (name == "fp32") return DType::FP32;
  return DType::None;
}

bool layout_from_name(const std::string& name, Layout& layout) {
  if (name == "nchw") layout = Layout::ChannelsFirst;
  else if (name == "nhwc") layout = Layout::ChannelsLast;
  else return false;
  return true;
}

bool activation_from_name(const std::string& name, Activation& activation) {
  if (name == "silu") activation = Activation::SiLU;
  else if (name == "none") activation = Activation::None;
  else return false;
  return true;
}

}  // namespace gnsilu::cache
