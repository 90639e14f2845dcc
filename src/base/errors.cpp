#include "base/errors.hpp"

#include "base/driver.hpp"

namespace gnsilu {

Error::Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}

CudaError::CudaError(int result, const std::string& message, Status status)
    : Error(status, message), result_(result) {}

CompileError::CompileError(const std::string& message, std::string log, std::string options)
    : Error(Status::Compile, message), log_(std::move(log)), options_(std::move(options)) {}

namespace detail {

void throw_invalid(const std::string& name, const std::string& what) {
  throw Error(Status::InvalidArgument, "gnsilu: invalid argument '" + name + "': " + what);
}

namespace {

// "runtime/launch.cpp" of whatever path the compiler was given (absolute, or relative to the build folder when
// ccache rewrote it): messages name the same place on every machine and in every build folder.
std::string where(const char* file, int line) {
  const std::string path = file;
  const auto last = path.rfind('/');
  const auto before = last == std::string::npos || last == 0 ? std::string::npos : path.rfind('/', last - 1);
  return (before == std::string::npos ? path : path.substr(before + 1)) + ":" + std::to_string(line);
}

}  // namespace

void throw_cuda(CUresult result, const char* call, const char* file, int line) {
  const Status status = result == CUDA_ERROR_OUT_OF_MEMORY ? Status::OutOfMemory : Status::Cuda;
  throw CudaError(static_cast<int>(result),
                  std::string("gnsilu: ") + call + " failed: " + describe(result) + " at " + where(file, line),
                  status);
}

void throw_nvrtc(nvrtcResult result, const char* call, const char* file, int line) {
  throw Error(Status::Compile, std::string("gnsilu: ") + call + " failed: " + nvrtcGetErrorString(result) + " at " +
                                   where(file, line));
}

}  // namespace detail
}  // namespace gnsilu
