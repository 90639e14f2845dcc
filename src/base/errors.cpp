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

void throw_cuda(CUresult result, const char* call, const char* file, int line) {
  const Status status = result == CUDA_ERROR_OUT_OF_MEMORY ? Status::OutOfMemory : Status::Cuda;
  throw CudaError(static_cast<int>(result),
                  std::string("gnsilu: ") + call + " failed: " + describe(result) + " at " + file + ":" +
                      std::to_string(line),
                  status);
}

void throw_nvrtc(nvrtcResult result, const char* call, const char* file, int line) {
  throw Error(Status::Compile, std::string("gnsilu: ") + call + " failed: " + nvrtcGetErrorString(result) + " at " +
                                   file + ":" + std::to_string(line));
}

}  // namespace detail
}  // namespace gnsilu
