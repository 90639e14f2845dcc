#include "runtime/kernels.hpp"

#include <cstdint>
#include <cstdio>

#include "base/errors.hpp"
#include "base/hash.hpp"
#include "base/launch_config.hpp"
#include "runtime/kernel_sources.hpp"

namespace gnsilu::detail {

std::array<std::string, kKernelCount> kernel_names(const Variant& v) {
  const std::string x = std::to_string(static_cast<int>(v.x_dtype));
  const std::string y = std::to_string(static_cast<int>(v.y_dtype));
  const std::string w = std::to_string(v.config.warps);
  const std::string e = std::to_string(v.config.elems_per_load);
  const std::string s = std::to_string(v.config.stages);
  const std::string l = std::to_string(static_cast<int>(v.layout));
  const std::string a = std::to_string(static_cast<int>(v.activation));
  return {
      "gnsilu::kernel::chunk_stats<" + x + "," + w + "," + s + "," + l + ",0>",
      "gnsilu::kernel::finalize<" + x + "," + l + ">",
      "gnsilu::kernel::apply<" + x + "," + y + "," + w + "," + e + "," + l + "," + a + ",0>",
      "gnsilu::kernel::fused<" + x + "," + y + "," + w + "," + e + "," + l + "," + a + ">",
      "gnsilu::kernel::apply_padded<" + x + "," + y + "," + l + "," + a + ">",
      "gnsilu::kernel::chunk_stats<" + x + "," + w + "," + s + "," + l + ",1>",
      "gnsilu::kernel::apply<" + x + "," + y + "," + w + "," + e + "," + l + "," + a + ",1>",
  };
}

CompiledProgram compile_variants(int arch, std::span<const Variant> variants,
                                 const std::vector<std::string>& extra_options) {
  CompileRequest request;
  request.arch = arch;
  request.extra_options = extra_options;
  for (const auto& v : variants) {
    check_config(v.config);
    for (auto& name : kernel_names(v)) request.names.push_back(std::move(name));
  }
  return compile(request);
}

std::string describe(const Variant& v) {
  return std::string(dtype_name(v.x_dtype)) + "->" + dtype_name(v.y_dtype) + " " + layout_name(v.layout) + " " +
         activation_name(v.activation) + " " + to_string(v.config);
}

std::string code_name(const Variant& v) {
  return std::string(dtype_name(v.x_dtype)) + "-" + dtype_name(v.y_dtype) + "-e" +
         std::to_string(v.config.elems_per_load) + "-w" + std::to_string(v.config.warps) + "-s" +
         std::to_string(v.config.stages) + "-" + layout_name(v.layout) + "-" + activation_name(v.activation);
}

std::optional<Variant> variant_of_code_name(const std::string& name) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const auto dash = name.find('-', start);
    parts.push_back(name.substr(start, dash == std::string::npos ? std::string::npos : dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  if (parts.size() != 7) return std::nullopt;
  Variant v;
  bool x_ok = false, y_ok = false, layout_ok = false, activation_ok = false;
  for (DType d : {DType::BF16, DType::FP16, DType::FP32}) {
    if (parts[0] == dtype_name(d)) v.x_dtype = d, x_ok = true;
    if (parts[1] == dtype_name(d)) v.y_dtype = d, y_ok = true;
  }
  for (Layout l : {Layout::ChannelsFirst, Layout::ChannelsLast})
    if (parts[5] == layout_name(l)) v.layout = l, layout_ok = true;
  for (Activation a : {Activation::SiLU, Activation::None})
    if (parts[6] == activation_name(a)) v.activation = a, activation_ok = true;
  auto number = [](const std::string& part, char prefix, int& out) {
    if (part.size() < 2 || part[0] != prefix || part.find_first_not_of("0123456789", 1) != std::string::npos ||
        part.size() > 4)
      return false;
    out = std::stoi(part.substr(1));
    return true;
  };
  if (!x_ok || !y_ok || !layout_ok || !activation_ok || !number(parts[2], 'e', v.config.elems_per_load) ||
      !number(parts[3], 'w', v.config.warps) || !number(parts[4], 's', v.config.stages))
    return std::nullopt;
  try {
    check_config(v.config);
  } catch (const Error&) {
    return std::nullopt;
  }
  if (code_name(v) != name) return std::nullopt;
  return v;
}

const std::string& code_version() {
  static const std::string version = [] {
    std::string text = kKernelSourceHash;
    for (const auto& o : fixed_options(0, true)) {
      if (o.rfind("--gpu-architecture", 0) != 0) text += "|" + o;
    }
    text += "|nvrtc " + nvrtc_version();
    Fnv1a hash;
    hash.add(text);
    return std::string(kKernelSourceHash).substr(0, 12) + "-" + hash.hex();
  }();
  return version;
}

}  // namespace gnsilu::detail
