// For the GPU test programs' main(): whether a usable driver and device are present; if not, prints
// "SKIPPED: <why>" so that the caller exits 77 (ctest's skip code for the "gpu" label). A single test case that
// cannot run on this machine uses skip_case.hpp.
#pragma once

#include <cstdio>
#include <string>

#include "base/driver.hpp"
#include "gnsilu/gnsilu.hpp"

namespace testing {

inline bool gpu_present_or_say_why() {
  std::string why;
  if (!gnsilu::detail::driver_available(&why)) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return false;
  }
  try {
    gnsilu::check_device();
  } catch (const gnsilu::Error& e) {
    std::printf("SKIPPED: %s\n", e.what());
    return false;
  }
  return true;
}

}  // namespace testing
