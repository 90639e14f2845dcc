// Random input tensors for the tools: normally distributed values of a seeded engine, written as bf16, fp16 or
// fp32 into host memory or device memory. Each tool keeps its own engine, seed and distribution (NormalSpec), so
// that its inputs stay what they were.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <variant>
#include <vector>

#include "gnsilu/gnsilu.hpp"

namespace gnsilu::tools {

enum class Engine { Mt19937, Mt19937_64 };

struct NormalSpec {
  Engine engine = Engine::Mt19937;
  uint64_t seed = 0;
  float mean = 0.0f;
  float stddev = 1.0f;
};

// The draws of one seeded engine through one std::normal_distribution<float>, in order.
class NormalSource {
 public:
  explicit NormalSource(const NormalSpec& spec);
  float next();
  // Writes the next `n` draws into `host` as `dtype` (n * dtype_size(dtype) bytes; bf16 and fp16 rounded to nearest
  // even).
  void fill(void* host, std::size_t n, DType dtype);

 private:
  std::variant<std::mt19937, std::mt19937_64> engine_;
  std::normal_distribution<float> normal_;
};

// `n` draws of `spec` as `dtype`, in host memory.
std::vector<unsigned char> random_host(std::size_t n, DType dtype, const NormalSpec& spec);

// Fills `n` elements of `dtype` at `dst` (device memory in the current context) with draws of `spec`. With
// `pattern_bytes` 0 every element is drawn; otherwise the first pattern_bytes / dtype_size(dtype) draws are
// repeated over the buffer (cheaper for large tensors whose values do not matter).
void fill_device(CUdeviceptr dst, std::size_t n, DType dtype, const NormalSpec& spec, std::size_t pattern_bytes = 0);

}  // namespace gnsilu::tools
