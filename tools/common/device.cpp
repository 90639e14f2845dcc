#include "common/device.hpp"

#include "base/driver.hpp"
#include "base/errors.hpp"
#include "base/log.hpp"
#include "gnsilu/gnsilu.hpp"

namespace gnsilu::tools {

bool gpu_present(std::string& why) {
  if (!detail::driver_available(&why)) return false;
  try {
    check_device();
    return true;
  } catch (const Error& e) {
    why = e.what();
    return false;
  }
}

PrimaryContext::PrimaryContext(int ordinal) {
  const auto& d = detail::driver();
  GNSILU_CHECK(d.cuDeviceGet(&device_, ordinal));
  GNSILU_CHECK(d.cuDevicePrimaryCtxRetain(&context_, device_));
  try {
    GNSILU_CHECK(d.cuCtxSetCurrent(context_));
    info_ = &detail::device_info(device_);
  } catch (...) {
    d.cuDevicePrimaryCtxRelease_v2(device_);
    throw;
  }
}

PrimaryContext::~PrimaryContext() {
  const auto& d = detail::driver();
  detail::log_dropped(d.cuCtxSynchronize(), "cuCtxSynchronize (the tool's context)");
  try {
    release_workspaces();
  } catch (const std::exception& e) {  // nothing to do about it at this point but say so
    detail::logger().warn("releasing the workspaces at exit failed: {}", e.what());
  }
  detail::log_dropped(d.cuDevicePrimaryCtxRelease_v2(device_), "cuDevicePrimaryCtxRelease (the tool's context)");
}

}  // namespace gnsilu::tools
