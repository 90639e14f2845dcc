// gnsilu-tune's --arch values in the spellings users type: 90, sm_90, sm90, compute_90, 9.0 (any case), each as a
// compute capability times ten. CLI11 splits comma lists before these functions see them.
#pragma once

#include <cctype>
#include <optional>
#include <string>
#include <vector>

namespace gnsilu::tune {

// The compute capability (90 for sm_90) that `text` spells, or nullopt.
inline std::optional<int> parse_arch(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* prefix : {"compute_", "sm_", "sm"}) {
    const std::string p = prefix;
    if (text.rfind(p, 0) == 0) {
      text = text.substr(p.size());
      break;
    }
  }
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 3 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  int value = 0;
  const auto dot = text.find('.');
  if (dot != std::string::npos) {  // 9.0, 10.0, 12.1: major.minor
    const std::string major = text.substr(0, dot), minor = text.substr(dot + 1);
    if (!digits(major) || major.size() > 2 || minor.size() != 1 || !digits(minor)) return std::nullopt;
    value = std::stoi(major) * 10 + std::stoi(minor);
  } else {
    if (!digits(text)) return std::nullopt;
    value = std::stoi(text);
  }
  if (value < 10 || value > 999) return std::nullopt;
  return value;
}

// Every value parsed, in order and without repeats; `bad` gets the first value not understood ("" if none).
inline std::vector<int> parse_archs(const std::vector<std::string>& values, std::string& bad) {
  std::vector<int> archs;
  bad.clear();
  for (const auto& v : values) {
    const auto a = parse_arch(v);
    if (!a) {
      bad = v;
      return {};
    }
    bool seen = false;
    for (int x : archs) seen = seen || x == *a;
    if (!seen) archs.push_back(*a);
  }
  return archs;
}

}  // namespace gnsilu::tune
