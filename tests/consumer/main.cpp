// A user's program on an installed gnsilu (find_package(gnsilu CONFIG), gnsilu::gnsilu): the C API (from C, in
// c_part.c, and from C++) and the C++ API. Exit 0 when every call gives what this machine should give:
//   - without a usable GPU (no driver, a stub driver, no device, or none of compute capability 7.5): the device
//     calls report that status (NO_DRIVER, NO_DEVICE or UNSUPPORTED_DEVICE), the same in C and C++;
//   - with one: check_device succeeds, and a call on host memory is refused as INVALID_ARGUMENT naming x (or runs,
//     where the system lets the GPU use host memory);
// and the calls that need no GPU (versions, workspace sizes, argument errors, the CPU reference) succeed. Else 1.
#include <gnsilu/gnsilu.h>
#include <gnsilu/gnsilu.hpp>
#include <gnsilu/reference.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "c_part.h"

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAIL: %s\n", what);
    ++failures;
  }
}

const char* name(gnsilu::Status status) { return gnsilu_status_name(static_cast<gnsilu_status>(status)); }

bool no_usable_device(gnsilu_status s) {
  return s == GNSILU_ERROR_NO_DRIVER || s == GNSILU_ERROR_NO_DEVICE || s == GNSILU_ERROR_UNSUPPORTED_DEVICE;
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // line by line, also into a pipe: a crash shows how far it got
  // ---- the C API, from C and from C++
  gnsilu_status device = GNSILU_ERROR_INTERNAL;
  failures += consumer_c_part(&device);
  check(device == GNSILU_SUCCESS || no_usable_device(device), "gnsilu_check_device: SUCCESS or a no-device status");
  check(std::strcmp(gnsilu_version(), GNSILU_PACKAGE_VERSION) == 0,
        "gnsilu_version() is the version find_package found (" GNSILU_PACKAGE_VERSION ")");
  const int64_t shape4[4] = {2, 64, 8, 8};
  std::size_t c_bytes = 0;
  check(gnsilu_workspace_size(shape4, 4, 32, &c_bytes) == GNSILU_SUCCESS, "gnsilu_workspace_size");

  // ---- the C++ API
  std::printf("C++ gnsilu::version: %s\n", gnsilu::version());
  check(std::strcmp(gnsilu::version(), gnsilu_version()) == 0, "gnsilu::version() == gnsilu_version()");

  const int64_t shape[] = {2, 64, 8, 8};  // N, C, H, W
  std::vector<float> x(2 * 64 * 8 * 8), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  gnsilu::Problem p;
  p.x = x.data();
  p.x_dtype = gnsilu::DType::FP32;
  p.y = y.data();
  p.y_dtype = gnsilu::DType::FP32;
  p.shape = shape;
  p.num_groups = 32;

  const std::size_t bytes = gnsilu::workspace_size(p);
  std::printf("C++ gnsilu::workspace_size: %zu bytes\n", bytes);
  check(bytes == c_bytes, "gnsilu::workspace_size(problem) == gnsilu_workspace_size");

  try {  // an argument error: gnsilu::Error with its Status, the message naming the argument
    gnsilu::Problem bad = p;
    bad.eps = -1.0;
    gnsilu::group_norm_silu(bad);
    check(false, "group_norm_silu with eps = -1 throws");
  } catch (const gnsilu::Error& e) {
    std::printf("C++ gnsilu::group_norm_silu (eps -1): %s: %s\n", name(e.status()), e.what());
    check(e.status() == gnsilu::Status::InvalidArgument && std::strstr(e.what(), "eps") != nullptr,
          "eps = -1 is InvalidArgument naming eps");
  }
  try {  // the same, caught as the standard base class (gnsilu::Error is a std::runtime_error)
    gnsilu::Problem bad = p;
    bad.num_groups = 3;
    gnsilu::group_norm_silu(bad);
    check(false, "group_norm_silu with 3 groups of 64 channels throws");
  } catch (const std::exception& e) {
    std::printf("C++ gnsilu::group_norm_silu (3 groups), caught as std::exception: %s\n", e.what());
    check(std::strstr(e.what(), "num_groups") != nullptr, "3 groups of 64 channels: the message names num_groups");
  }

  // The CPU reference (host pointers): the same checks and bits as the GPU kernels, no GPU needed.
  gnsilu::reference_group_norm_silu(p, 1);
  double sum = 0;
  bool finite = true;
  for (float v : y) {
    finite = finite && std::isfinite(v);
    sum += v;
  }
  std::printf("C++ gnsilu::reference_group_norm_silu: ok (mean of y %.6f)\n", sum / static_cast<double>(y.size()));
  check(finite, "the reference's output is finite");

  gnsilu_status cpp_device = GNSILU_SUCCESS;
  try {
    gnsilu::check_device();
    std::printf("C++ gnsilu::check_device: SUCCESS\n");
  } catch (const gnsilu::Error& e) {
    cpp_device = static_cast<gnsilu_status>(e.status());
    std::printf("C++ gnsilu::check_device: %s: %s\n", name(e.status()), e.what());
  }
  check(cpp_device == device, "gnsilu::check_device() agrees with gnsilu_check_device()");

  // A call on host memory: without a GPU, the device status; with one, x is not device memory.
  gnsilu_status call = GNSILU_SUCCESS;
  std::string message;
  try {
    gnsilu::group_norm_silu(p);
  } catch (const gnsilu::Error& e) {
    call = static_cast<gnsilu_status>(e.status());
    message = e.what();
  }
  std::printf("C++ gnsilu::group_norm_silu (host buffers): %s%s%s\n", gnsilu_status_name(call),
              message.empty() ? "" : ": ", message.c_str());
  if (device == GNSILU_SUCCESS) {
    check(call == GNSILU_SUCCESS || (call == GNSILU_ERROR_INVALID_ARGUMENT && message.find("'x'") != std::string::npos),
          "with a GPU: a call on host memory runs or is refused as INVALID_ARGUMENT naming x");
  } else {
    check(call == device, "without a usable GPU: group_norm_silu gives the device status");
  }

  if (failures != 0) {
    std::printf("gnsilu-consumer: FAILED (%d check%s)\n", failures, failures == 1 ? "" : "s");
    return 1;
  }
  std::printf("gnsilu-consumer: PASS (%s)\n", device == GNSILU_SUCCESS
                                                 ? "a usable GPU: check_device succeeded"
                                                 : "no usable GPU: every device call gave the expected status");
  return 0;
}
