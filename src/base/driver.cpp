#include "base/driver.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "base/errors.hpp"
#include "base/log.hpp"

namespace gnsilu::detail {
namespace {

struct Loaded {
  Driver driver;
  bool ok = false;
  Status status = Status::NoDriver;
  std::string why;
};

Loaded load() {
  Loaded out;
  const char* override_path = std::getenv("GNSILU_LIBCUDA");
  const std::string path = override_path != nullptr && *override_path != '\0' ? override_path : "libcuda.so.1";
  // The handle is kept for the life of the process: the driver is never unloaded.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    out.why = "no CUDA driver: cannot load " + path + " (" + (reason != nullptr ? reason : "unknown reason") +
              "); install the NVIDIA driver, or set GNSILU_LIBCUDA to its libcuda.so.1";
    return out;
  }
  Driver& d = out.driver;
// `member` names a member (d.member) and `symbol` is a string literal: parentheses would break the first.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define GNSILU_DRIVER_RESOLVE(member, symbol)                                              \
  d.member = reinterpret_cast<decltype(d.member)>(dlsym(handle, symbol));                  \
  if (d.member == nullptr) {                                                               \
    out.why = std::string("no usable CUDA driver: ") + path + " lacks " + symbol +         \
              " (the driver is too old; gnsilu needs a driver for CUDA 12.0 or newer)";   \
    return out;                                                                            \
  }
  GNSILU_DRIVER_FUNCTIONS(GNSILU_DRIVER_RESOLVE)
#undef GNSILU_DRIVER_RESOLVE
  // NOLINTEND(bugprone-macro-parentheses)
  const CUresult init = d.cuInit(0);
  if (init == CUDA_ERROR_STUB_LIBRARY) {
    out.why = "no CUDA driver: " + path + " is the toolkit's stub library, not a driver";
    return out;
  }
  if (init == CUDA_ERROR_NO_DEVICE) {
    out.status = Status::NoDevice;
    out.why = "no CUDA device: the driver found none (cuInit: CUDA_ERROR_NO_DEVICE)";
    return out;
  }
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    d.cuGetErrorName(init, &name);
    out.why = std::string("CUDA driver failed to initialise: cuInit returned ") + (name != nullptr ? name : "?") +
              " (" + std::to_string(static_cast<int>(init)) + ")";
    return out;
  }
  if (d.cuDriverGetVersion(&d.version) != CUDA_SUCCESS || d.version < 12000) {
    out.why = "no usable CUDA driver: version " + std::to_string(d.version) + " is older than 12.0";
    return out;
  }
  out.ok = true;
  return out;
}

const Loaded& loaded() {
  static const Loaded instance = load();
  return instance;
}

}  // namespace

const Driver& driver() {
  const Loaded& l = loaded();
  if (!l.ok) throw Error(l.status, l.why);
  return l.driver;
}

bool driver_available(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why != nullptr) *why = l.why;
  return l.ok;
}

std::string describe(CUresult result) {
  const Loaded& l = loaded();
  const char* name = nullptr;
  const char* text = nullptr;
  if (l.driver.cuGetErrorName != nullptr) l.driver.cuGetErrorName(result, &name);
  if (l.driver.cuGetErrorString != nullptr) l.driver.cuGetErrorString(result, &text);
  std::string out = name != nullptr ? name : "CUresult " + std::to_string(static_cast<int>(result));
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

void log_dropped(CUresult result, const char* what) noexcept {
  if (result == CUDA_SUCCESS) return;
  try {
    if (result == CUDA_ERROR_DEINITIALIZED) logger().debug("{} at exit: {}", what, describe(result));
    else logger().warn("{} failed in a destructor (nothing else to do about it): {}", what, describe(result));
  } catch (...) {  // logging itself failed: nothing left to tell
  }
}

void StreamDestroy::operator()(CUstream stream) const noexcept {
  if (stream != nullptr) log_dropped(driver().cuStreamDestroy_v2(stream), "cuStreamDestroy");
}

void EventDestroy::operator()(CUevent event) const noexcept {
  if (event != nullptr) log_dropped(driver().cuEventDestroy_v2(event), "cuEventDestroy");
}

UniqueStream make_stream(unsigned flags) {
  CUstream stream = nullptr;
  GNSILU_CHECK(driver().cuStreamCreate(&stream, flags));
  return UniqueStream(stream);
}

UniqueEvent make_event(unsigned flags) {
  CUevent event = nullptr;
  GNSILU_CHECK(driver().cuEventCreate(&event, flags));
  return UniqueEvent(event);
}

}  // namespace gnsilu::detail
