#include "common/random_fill.hpp"

#include <algorithm>
#include <cstring>

#include "base/driver.hpp"
#include "base/errors.hpp"
#include "kernels/gnsilu_math.cuh"

namespace gnsilu::tools {

NormalSource::NormalSource(const NormalSpec& spec) : normal_(spec.mean, spec.stddev) {
  if (spec.engine == Engine::Mt19937) {
    engine_.emplace<std::mt19937>(static_cast<std::mt19937::result_type>(spec.seed));
  } else {
    engine_.emplace<std::mt19937_64>(spec.seed);
  }
}

float NormalSource::next() {
  return std::visit([&](auto& rng) { return normal_(rng); }, engine_);
}

void NormalSource::fill(void* host, std::size_t n, DType dtype) {
  auto* out = static_cast<unsigned char*>(host);
  std::visit(
      [&](auto& rng) {
        if (dtype == DType::FP32) {
          for (std::size_t i = 0; i < n; ++i) {
            const float v = normal_(rng);
            std::memcpy(out + 4 * i, &v, 4);
          }
          return;
        }
        const bool bf16 = dtype == DType::BF16;
        for (std::size_t i = 0; i < n; ++i) {
          const float v = normal_(rng);
          const uint16_t h = bf16 ? math::float_to_bf16(v) : math::float_to_fp16(v);
          std::memcpy(out + 2 * i, &h, 2);
        }
      },
      engine_);
}

std::vector<unsigned char> random_host(std::size_t n, DType dtype, const NormalSpec& spec) {
  std::vector<unsigned char> host(n * dtype_size(dtype));
  NormalSource(spec).fill(host.data(), n, dtype);
  return host;
}

void fill_device(CUdeviceptr dst, std::size_t n, DType dtype, const NormalSpec& spec, std::size_t pattern_bytes) {
  const std::size_t size = dtype_size(dtype);
  const std::size_t pattern = pattern_bytes == 0 ? n : std::min(n, std::max<std::size_t>(pattern_bytes / size, 1));
  const std::vector<unsigned char> host = random_host(pattern, dtype, spec);
  for (std::size_t done = 0; done < n; done += pattern) {
    const std::size_t count = std::min(pattern, n - done);
    GNSILU_CHECK(detail::driver().cuMemcpyHtoD_v2(dst + done * size, host.data(), count * size));
  }
}

}  // namespace gnsilu::tools
