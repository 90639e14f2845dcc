// The C API as other languages see it: status codes, messages naming the argument, nothing written on
// error, zero-element calls, thread-local messages, and a clear answer where there is no driver or device.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "c_api_codes.h"
#include "base/driver.hpp"
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

namespace {

// A valid descriptor over host buffers: without a device it reaches the device checks (NO_DRIVER / NO_DEVICE, or
// INVALID_ARGUMENT 'x' for host memory where a driver is present); every argument error comes before those.
struct Described {
  std::vector<float> x = std::vector<float>(2 * 8 * 16, 1.0f);
  std::vector<float> y = std::vector<float>(2 * 8 * 16, 7.0f);
  std::vector<int64_t> shape{2, 8, 4, 4};
  gnsilu_problem p{};
  Described() {
    init_problem_from_c(&p);
    p.x = x.data();
    p.x_dtype = GNSILU_FP32;
    p.y = y.data();
    p.y_dtype = GNSILU_FP32;
    p.shape = shape.data();
    p.ndim = 4;
    p.num_groups = 4;
  }
  bool y_untouched() const {
    for (float v : y)
      if (v != 7.0f) return false;
    return true;
  }
};

bool reached_the_device(gnsilu_status s) {
  return s == GNSILU_ERROR_NO_DRIVER || s == GNSILU_ERROR_NO_DEVICE ||
         (s == GNSILU_ERROR_INVALID_ARGUMENT && mentions("'x'"));
}

}  // namespace

TEST_CASE("gnsilu_problem_init gives the documented defaults") {
  gnsilu_problem p;
  std::memset(&p, 0xAB, sizeof p);
  init_problem_from_c(&p);
  CHECK(p.struct_size == sizeof(gnsilu_problem));
  CHECK(p.x == nullptr);
  CHECK(p.y == nullptr);
  CHECK(p.x_dtype == GNSILU_BF16);
  CHECK(p.y_dtype == GNSILU_BF16);
  CHECK(p.x_layout == GNSILU_CHANNELS_FIRST);
  CHECK(p.y_layout == GNSILU_CHANNELS_FIRST);
  CHECK(p.num_groups == 32);
  CHECK(p.weight == nullptr);
  CHECK(p.weight_dtype == GNSILU_FP32);
  CHECK(p.bias_dtype == GNSILU_FP32);
  CHECK(p.eps == 1e-6);
  CHECK(p.activation == GNSILU_ACTIVATION_SILU);
}

TEST_CASE("gnsilu_group_norm: valid descriptors in both layouts and activations reach the device checks") {
  for (int layout : {GNSILU_CHANNELS_FIRST, GNSILU_CHANNELS_LAST}) {
    for (int activation : {GNSILU_ACTIVATION_SILU, GNSILU_ACTIVATION_NONE}) {
      Described d;
      set_problem_codes(&d.p, layout, layout, activation);
      CHECK_MESSAGE(reached_the_device(gnsilu_group_norm(&d.p, nullptr, 0, nullptr)), gnsilu_last_error());
      CHECK(d.y_untouched());
    }
  }
  // Where the layouts are the same memory (no spatial elements, or one channel), x and y may name either.
  Described flat;
  flat.shape = {2, 8};
  flat.p.ndim = 2;
  set_problem_codes(&flat.p, GNSILU_CHANNELS_LAST, GNSILU_CHANNELS_FIRST, GNSILU_ACTIVATION_NONE);
  CHECK_MESSAGE(reached_the_device(gnsilu_group_norm(&flat.p, nullptr, 0, nullptr)), gnsilu_last_error());
  Described one;
  one.shape = {2, 1, 4, 4};
  one.p.num_groups = 1;
  set_problem_codes(&one.p, GNSILU_CHANNELS_FIRST, GNSILU_CHANNELS_LAST, GNSILU_ACTIVATION_SILU);
  CHECK_MESSAGE(reached_the_device(gnsilu_group_norm(&one.p, nullptr, 0, nullptr)), gnsilu_last_error());
  // Zero elements: success, nothing touched.
  Described empty;
  empty.shape = {0, 8, 4, 4};
  set_problem_codes(&empty.p, GNSILU_CHANNELS_LAST, GNSILU_CHANNELS_LAST, GNSILU_ACTIVATION_NONE);
  CHECK(gnsilu_group_norm(&empty.p, nullptr, 0, nullptr) == GNSILU_SUCCESS);
}

TEST_CASE("gnsilu_group_norm: each bad field gets INVALID_ARGUMENT naming it, and y untouched") {
  struct Bad {
    const char* name;
    void (*spoil)(Described&);
  };
  const Bad cases[] = {
      {"'x_layout'", [](Described& d) { set_problem_codes(&d.p, 2, 2, 0); }},
      {"'x_layout'", [](Described& d) { set_problem_codes(&d.p, -1, 0, 0); }},
      {"'y_layout'", [](Described& d) { set_problem_codes(&d.p, 0, 9, 0); }},
      {"'y_layout'", [](Described& d) { set_problem_codes(&d.p, GNSILU_CHANNELS_LAST, GNSILU_CHANNELS_FIRST, 0); }},
      {"'y_layout'", [](Described& d) { set_problem_codes(&d.p, GNSILU_CHANNELS_FIRST, GNSILU_CHANNELS_LAST, 0); }},
      {"'activation'", [](Described& d) { set_problem_codes(&d.p, 0, 0, 2); }},
      {"'activation'", [](Described& d) { set_problem_codes(&d.p, 0, 0, -7); }},
      {"'problem.struct_size'", [](Described& d) { d.p.struct_size = 8; }},
      {"'problem.struct_size'", [](Described& d) { d.p.struct_size = 0; }},
      {"'problem.struct_size'", [](Described& d) { d.p.struct_size = offsetof(gnsilu_problem, activation); }},
      {"'problem.struct_size'", [](Described& d) { d.p.struct_size = std::size_t{1} << 40; }},
      {"'x_dtype'", [](Described& d) { d.p.x_dtype = GNSILU_NONE; }},
      {"'num_groups'", [](Described& d) { d.p.num_groups = 3; }},
      {"'eps'", [](Described& d) { d.p.eps = 0; }},
      {"'ndim'", [](Described& d) { d.p.ndim = 1; }},
      {"'shape'", [](Described& d) { d.p.shape = nullptr; }},
      {"'y'", [](Described& d) { d.p.y = nullptr; }},
  };
  for (const auto& bad : cases) {
    Described d;
    bad.spoil(d);
    CHECK(gnsilu_group_norm(&d.p, nullptr, 0, nullptr) == GNSILU_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE(mentions(bad.name), "expected " << bad.name << ", message was: " << gnsilu_last_error());
    CHECK(d.y_untouched());
  }
  CHECK(gnsilu_group_norm(nullptr, nullptr, 0, nullptr) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("'problem'"));
}

TEST_CASE("gnsilu_group_norm: a larger struct from a newer header is read when its extra bytes are zero") {
  struct Newer {
    gnsilu_problem base;
    int64_t strides_from_a_later_version[8];
  };
  Described d;
  Newer newer{};
  newer.base = d.p;
  newer.base.struct_size = sizeof(Newer);
  CHECK_MESSAGE(reached_the_device(gnsilu_group_norm(&newer.base, nullptr, 0, nullptr)), gnsilu_last_error());
  newer.strides_from_a_later_version[3] = 5;
  CHECK(gnsilu_group_norm(&newer.base, nullptr, 0, nullptr) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("'problem.struct_size'"));
  CHECK(mentions("does not know"));
  CHECK(d.y_untouched());
}

TEST_CASE("gnsilu_problem_workspace_size agrees with gnsilu_workspace_size for every layout and activation") {
  const int64_t shape[] = {2, 320, 5, 45, 80};
  size_t expected = 0;
  REQUIRE(gnsilu_workspace_size(shape, 5, 32, &expected) == GNSILU_SUCCESS);
  for (int layout : {GNSILU_CHANNELS_FIRST, GNSILU_CHANNELS_LAST}) {
    for (int activation : {GNSILU_ACTIVATION_SILU, GNSILU_ACTIVATION_NONE}) {
      Described d;
      d.p.shape = shape;
      d.p.ndim = 5;
      d.p.num_groups = 32;
      set_problem_codes(&d.p, layout, layout, activation);
      size_t bytes = 0;
      REQUIRE(gnsilu_problem_workspace_size(&d.p, &bytes) == GNSILU_SUCCESS);
      CHECK(bytes == expected);
    }
  }
  Described d;
  CHECK(gnsilu_problem_workspace_size(&d.p, nullptr) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("'bytes'"));
  CHECK(gnsilu_problem_workspace_size(nullptr, nullptr) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("'problem'"));
}

TEST_CASE("a problem's defaults are written once: the C init and the C++ Problem agree") {
  gnsilu_problem c;
  gnsilu_problem_init(&c);
  const gnsilu::Problem cpp;
  CHECK(c.num_groups == GNSILU_DEFAULT_NUM_GROUPS);
  CHECK(c.eps == GNSILU_DEFAULT_EPS);
  CHECK(cpp.num_groups == c.num_groups);
  CHECK(cpp.eps == c.eps);
  CHECK(cpp.num_groups == 32);
  CHECK(cpp.eps == 1e-6);
}
