// Small text helpers shared by the layers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gnsilu::detail {

// The parts with `separator` between them ("" for none). The kernel checksums (cache/entries) and the NVRTC
// options text (runtime/compiler) are built with it.
inline std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += separator;
    out += parts[i];
  }
  return out;
}

}  // namespace gnsilu::detail
