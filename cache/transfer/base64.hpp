// Base64 (RFC 4648, the standard alphabet, '=' padding, no line breaks): how the cache's export format carries
// compiled kernel images inside JSON. A pure utility: no knowledge of the cache.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gnsilu::detail {

std::string base64_encode(std::span<const char> bytes);

// Decodes `text` into `out`. Returns false for anything that is not base64 of whole bytes (a length that is not a
// multiple of 4, a character outside the alphabet, '=' anywhere but the last one or two places); `out` is then
// unspecified.
bool base64_decode(std::string_view text, std::vector<char>& out);

}  // namespace gnsilu::detail
