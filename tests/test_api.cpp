// The C API as other languages see it: status codes, messages naming the argument, nothing written on
// error, zero-element calls, thread-local messages, and a clear answer where there is no driver or device.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "c_api_codes.h"
#include "driver.hpp"
#include "gnsilu/gnsilu.h"
#include "gnsilu/gnsilu.hpp"

namespace {

struct Call {
  std::vector<float> x = std::vector<float>(2 * 8 * 16, 1.0f);
  std::vector<float> y = std::vector<float>(2 * 8 * 16, 7.0f);
  std::vector<int64_t> shape{2, 8, 16};
  int ndim = 3;
  int64_t groups = 4;
  int x_dtype = GNSILU_FP32, y_dtype = GNSILU_FP32;  // codes: a test may set any int, as a C caller can
  double eps = 1e-6;
  gnsilu_status run() {
    return call_with_codes(x.data(), x_dtype, y.data(), y_dtype, shape.data(), ndim, groups, nullptr, GNSILU_NONE,
                           nullptr, GNSILU_NONE, eps);
  }
  bool y_untouched() const {
    for (float v : y)
      if (v != 7.0f) return false;
    return true;
  }
};

bool mentions(const char* name) { return std::strstr(gnsilu_last_error(), name) != nullptr; }

}  // namespace

TEST_CASE("version and status names") {
  CHECK(std::string(gnsilu_version()) == gnsilu::version());
  CHECK(std::string(gnsilu_version()).find('.') != std::string::npos);
  CHECK(std::string(gnsilu_status_name(GNSILU_ERROR_INVALID_ARGUMENT)) == "GNSILU_ERROR_INVALID_ARGUMENT");
  CHECK(std::string(status_name_of_code(99)) == "GNSILU_UNKNOWN_STATUS");
}

TEST_CASE("each bad argument gets INVALID_ARGUMENT, a message naming it, and y untouched") {
  struct Bad {
    const char* name;
    void (*spoil)(Call&);
  };
  const Bad cases[] = {
      {"'x'", [](Call& c) { c.x.clear(); }},
      {"'y'", [](Call& c) { c.y.clear(); }},
      {"'x_dtype'", [](Call& c) { c.x_dtype = 5; }},
      {"'y_dtype'", [](Call& c) { c.y_dtype = GNSILU_NONE; }},
      {"'ndim'", [](Call& c) { c.ndim = 1; }},
      {"'ndim'", [](Call& c) { c.ndim = -2; }},
      {"'shape'", [](Call& c) { c.shape.clear(); }},
      {"'shape'", [](Call& c) { c.shape[2] = -16; }},
      {"'num_groups'", [](Call& c) { c.groups = 3; }},
      {"'num_groups'", [](Call& c) { c.groups = 0; }},
      {"'eps'", [](Call& c) { c.eps = 0.0; }},
      {"'eps'", [](Call& c) { c.eps = -1.0; }},
      {"'eps'", [](Call& c) { c.eps = std::strtod("nan", nullptr); }},
  };
  for (const auto& bad : cases) {
    Call call;
    bad.spoil(call);
    if (call.y.empty()) {
      CHECK(call_with_codes(call.x.data(), call.x_dtype, nullptr, call.y_dtype, call.shape.data(), call.ndim,
                            call.groups, nullptr, GNSILU_NONE, nullptr, GNSILU_NONE, call.eps) ==
            GNSILU_ERROR_INVALID_ARGUMENT);
    } else {
      const int64_t* shape = call.shape.empty() ? nullptr : call.shape.data();
      CHECK(call_with_codes(call.x.empty() ? nullptr : call.x.data(), call.x_dtype, call.y.data(), call.y_dtype,
                            shape, call.ndim, call.groups, nullptr, GNSILU_NONE, nullptr, GNSILU_NONE, call.eps) ==
            GNSILU_ERROR_INVALID_ARGUMENT);
      CHECK(call.y_untouched());
    }
    CHECK_MESSAGE(mentions(bad.name), "message was: " << gnsilu_last_error());
  }
}

TEST_CASE("a weight or bias given with an unknown dtype is refused") {
  Call call;
  float w[8] = {};
  CHECK(call_with_codes(call.x.data(), GNSILU_FP32, call.y.data(), GNSILU_FP32, call.shape.data(), 3, 4, w, 0, nullptr,
                        GNSILU_NONE, 1e-6) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("'weight_dtype'"));
  CHECK(call_with_codes(call.x.data(), GNSILU_FP32, call.y.data(), GNSILU_FP32, call.shape.data(), 3, 4, nullptr,
                        GNSILU_NONE, w, 12, 1e-6) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("'bias_dtype'"));
  CHECK(call.y_untouched());
}

TEST_CASE("zero elements succeed without touching anything, driver or not") {
  Call call;
  call.shape = {0, 8, 16};
  CHECK(call.run() == GNSILU_SUCCESS);
  CHECK(std::string(gnsilu_last_error()).empty());
  call.shape = {2, 8, 0};
  CHECK(call.run() == GNSILU_SUCCESS);
  CHECK(call.y_untouched());
}

TEST_CASE("workspace size") {
  const int64_t shape[] = {1, 128, 1024, 1024};
  size_t bytes = 0;
  REQUIRE(gnsilu_workspace_size(shape, 4, 32, &bytes) == GNSILU_SUCCESS);
  CHECK(bytes == gnsilu::workspace_size(shape, 32));
  CHECK(bytes >= 32u * 4096u * 32u);  // a record per chunk
  CHECK(gnsilu_workspace_size(shape, 4, 32, nullptr) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("'bytes'"));
  CHECK(gnsilu_workspace_size(shape, 4, 3, &bytes) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("'num_groups'"));
}

TEST_CASE("messages are per thread") {
  Call call;
  call.groups = 5;
  CHECK(call.run() == GNSILU_ERROR_INVALID_ARGUMENT);
  std::string other = "unset";
  std::thread([&] { other = gnsilu_last_error(); }).join();
  CHECK(other.empty());
  CHECK(mentions("'num_groups'"));
}

TEST_CASE("without a usable driver or device, valid calls say so clearly; with one, host memory is refused") {
  Call call;
  const gnsilu_status status = call.run();
  const gnsilu_status probe = gnsilu_check_device();
  std::string why;
  if (!gnsilu::detail::driver_available(&why)) {
    MESSAGE("no driver here: " << why);
    CHECK((status == GNSILU_ERROR_NO_DRIVER || status == GNSILU_ERROR_NO_DEVICE));
    CHECK((probe == GNSILU_ERROR_NO_DRIVER || probe == GNSILU_ERROR_NO_DEVICE));
    CHECK((mentions("no CUDA driver") || mentions("no usable CUDA driver") || mentions("no CUDA device")));
    const char* override_path = std::getenv("GNSILU_LIBCUDA");
    if (override_path != nullptr && std::strstr(override_path, "stubs") != nullptr) CHECK(mentions("stub"));
  } else {
    MESSAGE("a driver is present: host pointers must be refused");
    CHECK(status == GNSILU_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("'x'"));
  }
  CHECK(call.y_untouched());
  CHECK(gnsilu_release_workspaces() == GNSILU_SUCCESS);
}
