// FNV-1a, 64 bits: the one hash of the library's text keys and checksums (the code version, the compiled-kernel
// checksum, the hot-path table's key). Not cryptographic: it detects damage, not tampering (cache/trust does that).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace gnsilu::detail {

class Fnv1a {
 public:
  void add_byte(unsigned char byte) {
    h_ ^= byte;
    h_ *= 1099511628211ull;
  }
  void add(std::string_view bytes) {
    for (char c : bytes) add_byte(static_cast<unsigned char>(c));
  }
  void add(const char* data, std::size_t size) { add(std::string_view(data, size)); }
  // The whole value at once (not byte by byte): for hashing integers of a key.
  void add_word(uint64_t word) {
    h_ ^= word;
    h_ *= 1099511628211ull;
  }
  uint64_t value() const { return h_; }
  // 16 lower-case hex digits.
  std::string hex() const {
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h_));
    return out;
  }

 private:
  uint64_t h_ = 1469598103934665603ull;
};

}  // namespace gnsilu::detail
