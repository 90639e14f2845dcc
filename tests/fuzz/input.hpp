// Decoding a fuzz input front to back: bytes, little-endian integers and "interesting" values. Past the end every
// read gives zeros, so every input decodes, and hand-made seeds are easy to write (corpus/README.md).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace gnsilu::fuzz {

class Input {
 public:
  Input(const uint8_t* data, std::size_t size) : p_(data), end_(data + size) {}

  bool empty() const { return p_ == end_; }
  std::size_t left() const { return static_cast<std::size_t>(end_ - p_); }

  uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
  uint16_t u16() {
    const uint16_t lo = u8();
    return static_cast<uint16_t>(lo | (u8() << 8));
  }
  uint32_t u32() {
    const uint32_t lo = u16();
    return lo | (static_cast<uint32_t>(u16()) << 16);
  }
  uint64_t u64() {
    const uint64_t lo = u32();
    return lo | (static_cast<uint64_t>(u32()) << 32);
  }
  bool flag() { return (u8() & 1) != 0; }

  // Up to n bytes (fewer at the end of the input).
  std::vector<uint8_t> bytes(std::size_t n) {
    n = std::min(n, left());
    std::vector<uint8_t> out(p_, p_ + n);
    p_ += n;
    return out;
  }
  // A string of u8() % (max + 1) bytes (any bytes: NUL, invalid UTF-8).
  std::string text(std::size_t max) {
    const std::size_t n = u8() % (max + 1);
    const auto b = bytes(n);
    return std::string(b.begin(), b.end());
  }

  // Selector byte: a table of edge cases, small values, or (0xFF) 8 raw bytes.
  int64_t i64() {
    static constexpr int64_t kEdges[] = {
        0, 1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 64, 128, 256, 320, 512, 1000, 1024, 4096, 65536, 65537,
        -1, -2, std::numeric_limits<int32_t>::max(), int64_t{1} << 31, int64_t{1} << 32, (int64_t{1} << 32) + 1,
        int64_t{1} << 40, int64_t{1} << 59, (int64_t{1} << 59) + 1, int64_t{1} << 60, int64_t{1} << 61,
        int64_t{1} << 62, std::numeric_limits<int64_t>::max() / 8, std::numeric_limits<int64_t>::max() / 8 + 1,
        std::numeric_limits<int64_t>::max() / 16, std::numeric_limits<int64_t>::max(),
        std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::min() + 1, 3037000499, 3037000500};
    constexpr unsigned kCount = sizeof(kEdges) / sizeof(kEdges[0]);
    const uint8_t sel = u8();
    if (sel < kCount) return kEdges[sel];
    if (sel == 0xFF) return static_cast<int64_t>(u64());
    return sel - kCount;  // small non-negative values
  }
  int i32() {
    static constexpr int kEdges[] = {0, 1, 2, 3, 4, 5, 8, -1, -2, 64, 4096, 65536, 1 << 20,
                                     std::numeric_limits<int>::max(), std::numeric_limits<int>::min(), 255};
    const uint8_t sel = u8();
    if (sel < sizeof(kEdges) / sizeof(kEdges[0])) return kEdges[sel];
    if (sel == 0xFF) return static_cast<int>(u32());
    return sel & 0x0F;
  }
  double f64() {
    static constexpr double kEdges[] = {1e-6,
                                        1e-5,
                                        0.0,
                                        -0.0,
                                        -1e-6,
                                        1.0,
                                        std::numeric_limits<double>::quiet_NaN(),
                                        -std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        std::numeric_limits<double>::denorm_min(),
                                        std::numeric_limits<double>::min(),
                                        std::numeric_limits<double>::max(),
                                        std::numeric_limits<double>::lowest(),
                                        1e300,
                                        120.0};
    const uint8_t sel = u8();
    if (sel < sizeof(kEdges) / sizeof(kEdges[0])) return kEdges[sel];
    const uint64_t bits = u64();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// An invariant that does not hold: say which and stop (libFuzzer keeps the input as a crash).
[[noreturn]] inline void broken(const char* target, const char* what, const char* file, int line,
                                const std::string& detail = {}) {
  std::fprintf(stderr, "%s: invariant broken at %s:%d: %s\n", target, file, line, what);
  if (!detail.empty()) std::fprintf(stderr, "  %s\n", detail.c_str());
  std::abort();
}

}  // namespace gnsilu::fuzz
