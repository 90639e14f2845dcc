// The kernel sources (kernels/*.cu, *.cuh), embedded into the library at build time by
// cmake/embed_kernels.cmake: NVRTC compiles them from memory, never from the working directory.
#pragma once

#include <cstddef>

namespace gnsilu::detail {

struct EmbeddedFile {
  const char* name;  // file name, as included ("gnsilu_math.cuh")
  const char* text;  // NUL-terminated contents
  std::size_t size;  // bytes, without the NUL
};

extern const EmbeddedFile kKernelFiles[];
extern const std::size_t kKernelFileCount;
extern const char kKernelSourceHash[];  // SHA-256 over the names and contents of all kernel files

}  // namespace gnsilu::detail
