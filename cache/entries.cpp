#include "cache/entries.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>

#include "base/hash.hpp"
#include "base/text.hpp"

namespace gnsilu::cache {

std::string TuningKey::text() const {
  return device.name + "|sm" + std::to_string(device.arch) + "|" + std::to_string(device.sms) + "sm|" +
         std::to_string(device.memory_mib) + "MiB|" + std::to_string(device.l2_kib) + "KiB|" + code_version + "|cpg" +
         std::to_string(channels_per_group) + "|" + dtype_name(x_dtype) + ">" + dtype_name(y_dtype) + "|" +
         layout_name(layout) + "|" + activation_name(activation) + "|" + size_class;
}

std::string TunedShape::text() const {
  if (dims.empty()) return "";
  return shape_to_text(dims) + " G=" + std::to_string(groups);
}

std::ostream& operator<<(std::ostream& out, const TunedShape& shape) { return out << shape.text(); }

std::string shape_to_text(std::span<const int64_t> dims) {
  std::string out;
  for (auto d : dims) {
    if (!out.empty()) out += 'x';
    out += std::to_string(d);
  }
  return out;
}

std::optional<std::vector<int64_t>> shape_from_text(std::string_view text, std::string* problem) {
  std::vector<int64_t> dims;
  std::size_t start = 0;
  for (;;) {
    const std::size_t at = text.find('x', start);
    const std::string part(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) {
      if (problem) *problem = "\"" + part + "\" is not a positive whole number";
      return std::nullopt;
    }
    errno = 0;
    const long long v = std::strtoll(part.c_str(), nullptr, 10);
    if (errno == ERANGE || v <= 0) {
      if (problem) *problem = "\"" + part + "\" is out of range";
      return std::nullopt;
    }
    dims.push_back(v);
    if (at == std::string_view::npos) return dims;
    start = at + 1;
  }
}

TunedShape tuned_shape_from_legacy(std::string_view text, std::string_view size_class) {
  TunedShape shape;
  shape.path = size_class.ends_with("-fused") ? Path::Fused : Path::Split;
  const std::size_t space = text.find(" G=");
  if (space == std::string_view::npos) return shape;
  const auto dims = shape_from_text(text.substr(0, space));
  const auto groups = shape_from_text(text.substr(space + 3));  // one positive whole number
  if (!dims || !groups || groups->size() != 1) return shape;
  shape.dims = *dims;
  shape.groups = groups->front();
  return shape;
}

std::string size_class_of(std::size_t bytes, std::size_t l2_bytes, std::string_view path) {
  // Activations whose x and y fit in L2 run from cache on repeated calls; larger ones stream from DRAM.
  return std::string(bytes <= l2_bytes ? "l2-" : "dram-") + std::string(path);
}

std::string kernel_checksum(const std::vector<char>& image, const std::string& joined_names) {
  detail::Fnv1a hash;
  hash.add(image.data(), image.size());
  hash.add(joined_names);
  return hash.hex();
}

std::string join_lowered_names(const std::vector<std::string>& names) { return detail::join(names, "\n"); }

std::vector<std::string> split_lowered_names(const std::string& text) {
  std::vector<std::string> out;
  std::string::size_type start = 0;
  while (start < text.size()) {  // as std::getline by '\n': no empty last line
    const auto end = text.find('\n', start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}



}  // namespace gnsilu::cache
