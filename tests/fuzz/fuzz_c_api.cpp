// libFuzzer target: the C API's argument handling (gnsilu_group_norm_silu, gnsilu_group_norm with its descriptor,
// gnsilu_workspace_size and the small calls), with any dtype, layout and activation code, struct size, ndim,
// shape, num_groups, eps, null / fake / host pointers, overlaps and workspace sizes. Pointers are never device memory: fake ones point at unmapped addresses (a dereference crashes) and host
// ones at canary buffers (a write is seen). Without a driver (CI) a valid non-empty problem must stop at the
// driver check; with GNSILU_LIBCUDA at the toolkit's stub it stops there too.
//
// Invariants: the status is a gnsilu_status value with its name; gnsilu_last_error() is a C string, empty after a
// success and a message after an error; a bad argument that needs no GPU to see is
// INVALID_ARGUMENT; a success is a valid zero-element problem; gnsilu_workspace_size agrees with the call about
// the shape; no canary byte changes. Input format: corpus/README.md.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gnsilu/gnsilu.h"
#include "input.hpp"

extern "C" {
int fuzz_c_group_norm_silu(const void* x, int x_dtype, void* y, int y_dtype, const int64_t* shape, int ndim,
                           int64_t num_groups, const void* weight, int weight_dtype, const void* bias,
                           int bias_dtype, double eps, void* workspace, size_t workspace_bytes, void* stream);
int fuzz_c_group_norm(size_t struct_size, size_t buffer_size, unsigned char tail_byte, const void* x, int x_dtype,
                      int x_layout, void* y, int y_dtype, int y_layout, const int64_t* shape, int ndim,
                      int64_t num_groups, const void* weight, int weight_dtype, const void* bias, int bias_dtype,
                      double eps, int activation, void* workspace, size_t workspace_bytes, void* stream);
size_t fuzz_c_problem_size(void);
size_t fuzz_c_problem_first_size(void);
int fuzz_c_set_tune_policy(int policy);
const char* fuzz_c_status_name(int status);
}

namespace {

using gnsilu::fuzz::Input;

#define REQUIRE(cond, detail)                                                        \
  do {                                                                               \
    if (!(cond)) gnsilu::fuzz::broken("fuzz_c_api", #cond, __FILE__, __LINE__, detail); \
  } while (0)

// What gnsilu_check_device() said at start: NO_DRIVER / NO_DEVICE here; SUCCESS on a machine with a GPU.
int g_device_status = -1;

// Unmapped addresses (under the ASan shadow, far from the heap and the binary), one 16 MiB slot per argument.
constexpr std::uintptr_t kFakeBase = 0x40000000;
constexpr std::uintptr_t kFakeSlot = 0x1000000;

constexpr std::size_t kCanaryBytes = 4096;
constexpr uint8_t kCanaryByte = 0xA5;
alignas(64) uint8_t g_canary[5][kCanaryBytes];

bool status_known(int s) { return s >= GNSILU_SUCCESS && s <= GNSILU_ERROR_INTERNAL; }

// The arguments of the call being checked, for the report.
std::string g_call;

std::string describe(int status) {
  const char* e = gnsilu_last_error();
  return "status " + std::to_string(status) + ", last error \"" + (e != nullptr ? e : "(null)") + "\"" +
         (g_call.empty() ? "" : "\n  call: " + g_call);
}

void check_status(int status) {
  REQUIRE(status_known(status), describe(status));
  const char* name = fuzz_c_status_name(status);
  REQUIRE(name != nullptr && std::strncmp(name, "GNSILU_", 7) == 0 && std::strcmp(name, "GNSILU_UNKNOWN_STATUS") != 0,
          describe(status));
  const char* e = gnsilu_last_error();
  REQUIRE(e != nullptr, describe(status));
  const std::size_t length = std::strlen(e);  // a C string (ASan checks the read)
  if (status == GNSILU_SUCCESS) {
    REQUIRE(length == 0, describe(status));
  } else {
    REQUIRE(length > 0, describe(status));
  }
}

// A pointer argument: null, a fake device address (aligned or not), or a host canary buffer.
void* pointer(Input& in, int slot) {
  const uint8_t kind = in.u8() % 8;
  switch (kind) {
    case 0: return nullptr;
    case 1: return reinterpret_cast<void*>(kFakeBase + kFakeSlot * slot + (in.u8() % 16));  // maybe misaligned
    case 2: return g_canary[slot] + (in.u8() % 8);
    default: return reinterpret_cast<void*>(kFakeBase + kFakeSlot * slot + 256 * (in.u8() % 16));
  }
}

bool tensor_dtype(int d) { return d == GNSILU_BF16 || d == GNSILU_FP16 || d == GNSILU_FP32; }
std::size_t dtype_size(int d) { return d == GNSILU_FP32 ? 4 : tensor_dtype(d) ? 2 : 0; }
bool misaligned(const void* p, int d) {
  return p != nullptr && dtype_size(d) != 0 && reinterpret_cast<std::uintptr_t>(p) % dtype_size(d) != 0;
}

struct Shape {
  std::vector<int64_t> storage;
  const int64_t* data = nullptr;
  int ndim = 0;
};

// ndim <= 0, small, large (an array of exactly ndim values, mostly a fill value) or huge (shape null).
Shape shape(Input& in) {
  Shape s;
  const uint8_t kind = in.u8() % 16;
  if (kind < 10) {
    s.ndim = kind % 7;  // 0..6
  } else if (kind < 13) {
    s.ndim = in.i32();
  } else {
    s.ndim = 7 + in.u16() % 4090;
  }
  const bool null_shape = in.u8() == 0xEE;
  if (s.ndim > 0 && s.ndim <= 1 << 16 && !null_shape) {
    s.storage.resize(static_cast<std::size_t>(s.ndim));
    const std::size_t given = std::min<std::size_t>(s.storage.size(), 8);
    for (std::size_t i = 0; i < given; ++i) s.storage[i] = in.i64();
    const int64_t fill = in.u8() % 3;  // 0, 1 or 2 for the rest
    for (std::size_t i = given; i < s.storage.size(); ++i) s.storage[i] = fill;
    s.data = s.storage.data();
  } else if (s.ndim <= 0 && in.flag()) {
    static const int64_t one[1] = {1};
    s.data = one;  // a pointer with no dimensions to read
  }
  return s;
}

struct GeometryCheck {
  bool invalid = false;         // certainly rejected
  bool numel_zero = false;      // valid so far and no elements
  bool fits = false;            // valid, and every partial product far from overflow
  __int128 numel = 0;
  __int128 rows = 0;            // N * C
};

// What make_geometry must say, computed independently (128-bit, no overflow).
GeometryCheck expect_geometry(const Shape& s, int64_t num_groups) {
  GeometryCheck r;
  if (s.ndim < 2 || s.data == nullptr) {
    r.invalid = true;
    return r;
  }
  for (int i = 0; i < s.ndim; ++i)
    if (s.data[i] < 0) r.invalid = true;
  if (r.invalid || num_groups <= 0 || s.data[1] == 0 || s.data[1] % num_groups != 0) {
    r.invalid = true;
    return r;
  }
  constexpr __int128 kLimit = INT64_MAX / 8;
  __int128 nonzero = 1;  // product of the non-zero dimensions, saturated above kLimit
  bool has_zero = false;
  for (int i = 0; i < s.ndim; ++i) {
    if (s.data[i] == 0) {
      has_zero = true;
    } else if (nonzero <= kLimit) {
      nonzero *= s.data[i];
    }
  }
  if (!has_zero && nonzero > kLimit) {  // nothing this large exists: certainly rejected
    r.invalid = true;
    return r;
  }
  r.numel = has_zero ? 0 : nonzero;
  r.rows = static_cast<__int128>(s.data[0]) * s.data[1];
  r.numel_zero = has_zero;
  r.fits = nonzero <= (__int128{1} << 50);  // (the library's limit is 2^57 elements and rows)
  return r;
}

void fill_canaries() { std::memset(g_canary, kCanaryByte, sizeof g_canary); }
void check_canaries(int status) {
  for (const auto& buffer : g_canary)
    for (uint8_t b : buffer) REQUIRE(b == kCanaryByte, "a host buffer was written: " + describe(status));
}

void call_group_norm_silu(Input& in) {
  void* x = pointer(in, 0);
  void* y = nullptr;
  switch (in.u8() % 4) {
    case 0: y = x; break;  // in place
    case 1:  // overlapping (or, from null, a low address)
      y = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(x) + static_cast<int16_t>(in.u16()));
      break;
    default: y = pointer(in, 1); break;
  }
  if (x == nullptr && y != nullptr && in.flag()) y = nullptr;
  const int x_dtype = in.i32(), y_dtype = in.i32();
  const Shape s = shape(in);
  const int64_t num_groups = in.i64();
  const void* weight = pointer(in, 2);
  const int weight_dtype = in.i32();
  const void* bias = pointer(in, 3);
  const int bias_dtype = in.i32();
  const double eps = in.f64();
  void* workspace = in.flag() ? pointer(in, 4) : nullptr;
  std::size_t workspace_bytes = in.flag() ? static_cast<std::size_t>(in.i64()) : 0;
  void* stream = in.flag() ? reinterpret_cast<void*>(kFakeBase + 7 * kFakeSlot) : nullptr;

  g_call = "x=" + std::to_string(reinterpret_cast<std::uintptr_t>(x)) + "/" + std::to_string(x_dtype) +
           " y=" + std::to_string(reinterpret_cast<std::uintptr_t>(y)) + "/" + std::to_string(y_dtype) +
           " ndim=" + std::to_string(s.ndim) + " shape=" + (s.data == nullptr ? "null" : "");
  for (int i = 0; s.data != nullptr && i < std::min(s.ndim, 8); ++i) g_call += std::to_string(s.data[i]) + ",";
  g_call += " num_groups=" + std::to_string(num_groups) + " eps=" + std::to_string(eps) +
            " weight/bias=" + std::to_string(weight != nullptr) + "/" + std::to_string(weight_dtype) + "," +
            std::to_string(bias != nullptr) + "/" + std::to_string(bias_dtype);
  static const bool trace = std::getenv("GNSILU_FUZZ_TRACE") != nullptr;
  if (trace) std::fprintf(stderr, "fuzz_c_api: %s\n", g_call.c_str());
  fill_canaries();
  const int status = fuzz_c_group_norm_silu(x, x_dtype, y, y_dtype, s.data, s.ndim, num_groups, weight, weight_dtype,
                                            bias, bias_dtype, eps, workspace, workspace_bytes, stream);
  check_status(status);
  check_canaries(status);
  const std::string call_error = gnsilu_last_error();

  const bool args_invalid = x == nullptr || y == nullptr || !tensor_dtype(x_dtype) || !tensor_dtype(y_dtype) ||
                            (weight != nullptr && !tensor_dtype(weight_dtype)) ||
                            (bias != nullptr && !tensor_dtype(bias_dtype)) || misaligned(x, x_dtype) ||
                            misaligned(y, y_dtype) || misaligned(weight, weight_dtype) ||
                            misaligned(bias, bias_dtype) || !(eps > 0.0) || !std::isfinite(eps);
  const GeometryCheck g = expect_geometry(s, num_groups);
  if (args_invalid || g.invalid) REQUIRE(status == GNSILU_ERROR_INVALID_ARGUMENT, describe(status));
  if (status == GNSILU_SUCCESS) REQUIRE(!args_invalid && !g.invalid && g.numel_zero, describe(status));
  if (!args_invalid && !g.invalid && g.fits) {
    if (g.numel_zero) {
      REQUIRE(status == GNSILU_SUCCESS, describe(status));  // zero elements: nothing to do, no driver needed
    } else if (g_device_status != GNSILU_SUCCESS) {
      REQUIRE(status == g_device_status, describe(status));  // stops at the driver, before any pointer
    }
  }

  // gnsilu_workspace_size on the same shape agrees about the shape.
  std::size_t bytes = 0x5A5A5A5A;
  const bool pass_bytes = in.u8() != 0xEE;
  const int ws_status = gnsilu_workspace_size(s.data, s.ndim, num_groups, pass_bytes ? &bytes : nullptr);
  check_status(ws_status);
  if (!pass_bytes) {
    REQUIRE(ws_status == GNSILU_ERROR_INVALID_ARGUMENT, describe(ws_status));
    return;
  }
  if (g.invalid) REQUIRE(ws_status == GNSILU_ERROR_INVALID_ARGUMENT, describe(ws_status));
  if (!g.invalid && g.fits) REQUIRE(ws_status == GNSILU_SUCCESS, describe(ws_status));
  if (ws_status != GNSILU_SUCCESS) {
    REQUIRE(bytes == 0x5A5A5A5A, "bytes written on an error: " + describe(ws_status));
  } else {
    REQUIRE(!g.invalid, describe(ws_status));
    if (g.numel_zero) {
      REQUIRE(bytes == 0, "workspace for zero elements: " + std::to_string(bytes));
    } else {
      // 16 bytes of row constants per (sample, channel) at least: a smaller answer wrapped around.
      REQUIRE(static_cast<__int128>(bytes) >= 16 * g.rows,
              "workspace " + std::to_string(bytes) + " bytes is less than 16 per row (rows: " +
                  std::to_string(static_cast<double>(g.rows)) + ")");
    }
  }
  if (!args_invalid && g_device_status != GNSILU_SUCCESS) {
    // Without a driver the call fails on the shape exactly when gnsilu_workspace_size does.
    REQUIRE((status == GNSILU_ERROR_INVALID_ARGUMENT) == (ws_status == GNSILU_ERROR_INVALID_ARGUMENT),
            "call: " + call_error + "; workspace_size: " + describe(ws_status));
  }

  // The same arguments through gnsilu_group_norm's descriptor, with layout and activation codes and a struct size
  // that may be too small, the caller's own, or larger with a zero or non-zero tail. (Read last, so that corpus
  // files made before this part decode their earlier calls as before.)
  const uint8_t mode = in.u8();
  const int x_layout = (mode & 0x10) ? in.i32() % 4 : (mode & 1);
  const int y_layout = (mode & 0x20) ? in.i32() % 4 : x_layout ^ ((mode >> 1) & 1);
  const int activation = (mode & 0x40) ? in.i32() % 4 : ((mode >> 2) & 1);
  const std::size_t known = fuzz_c_problem_size();
  std::size_t struct_size = known, buffer_size = known;
  unsigned char tail = 0;
  switch ((mode >> 3) & 3) {
    case 0: break;
    case 1: struct_size = in.u8() % known; break;  // too small
    case 2: struct_size = buffer_size = known + 8 * (1 + in.u8() % 8); break;  // a newer caller, zero tail
    default:
      struct_size = buffer_size = known + 8 * (1 + in.u8() % 8);
      tail = static_cast<unsigned char>(in.u8() | 1);  // a newer caller that set a field this library lacks
      break;
  }
  fill_canaries();
  const int described = fuzz_c_group_norm(struct_size, buffer_size, tail, x, x_dtype, x_layout, y, y_dtype, y_layout,
                                          s.data, s.ndim, num_groups, weight, weight_dtype, bias, bias_dtype, eps,
                                          activation, workspace, workspace_bytes, stream);
  check_status(described);
  check_canaries(described);
  // Any size from the first version's (a caller built against 0.1: no padded output) up is accepted; the fields a
  // smaller struct does not hold whole keep their defaults (here: no padding, as the call above).
  const bool size_invalid = struct_size < fuzz_c_problem_first_size() || tail != 0;
  const bool codes_invalid = x_layout < 0 || x_layout > 1 || y_layout < 0 || y_layout > 1 || activation < 0 ||
                             activation > 1;
  // Different layouts are accepted only where they are the same memory: no spatial elements, or one channel.
  bool same_memory = false;
  if (!g.invalid) {
    __int128 spatial = 1;
    for (int i = 2; i < s.ndim && spatial <= (__int128{1} << 62); ++i) spatial *= s.data[i];
    same_memory = spatial == 1 || s.data[1] == 1;
  }
  const bool mixed = !codes_invalid && x_layout != y_layout && !same_memory;
  const bool described_invalid = size_invalid || codes_invalid || mixed || args_invalid || g.invalid;
  if (described_invalid) REQUIRE(described == GNSILU_ERROR_INVALID_ARGUMENT, describe(described));
  if (described == GNSILU_SUCCESS) REQUIRE(!described_invalid && g.numel_zero, describe(described));
  if (!described_invalid && g.fits) {
    // A valid descriptor behaves as the plain call: the same status without a driver (or for zero elements).
    if (g.numel_zero || g_device_status != GNSILU_SUCCESS) REQUIRE(described == status, describe(described));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("GNSILU_CACHE", "off", 1);  // never touch the user's cache files
  setenv("GNSILU_CACHE_SHARED", "", 1);
  if (std::getenv("GNSILU_LOG_LEVEL") == nullptr) setenv("GNSILU_LOG_LEVEL", "off", 1);
  g_device_status = gnsilu_check_device();
  check_status(g_device_status);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  Input in(data, size);
  g_call.clear();
  for (int calls = 0; calls < 16 && !in.empty(); ++calls) {
    const uint8_t op = in.u8();
    if (op < 200) {
      call_group_norm_silu(in);
      g_call.clear();
    } else if (op < 215) {
      const int policy = in.i32();
      const int status = fuzz_c_set_tune_policy(policy);
      check_status(status);
      REQUIRE(status == ((policy >= 0 && policy <= 2) ? GNSILU_SUCCESS : GNSILU_ERROR_INVALID_ARGUMENT),
              describe(status));
    } else if (op < 230) {
      const int code = in.i32();
      const char* name = fuzz_c_status_name(code);
      REQUIRE(name != nullptr && std::strlen(name) > 0, "no name for " + std::to_string(code));
      REQUIRE(status_known(code) == (std::strcmp(name, "GNSILU_UNKNOWN_STATUS") != 0), name);
    } else if (op < 240) {
      const int status = gnsilu_check_device();
      check_status(status);
      REQUIRE(status == g_device_status, describe(status));
    } else if (op < 250) {
      const int status = gnsilu_release_workspaces();
      check_status(status);
      REQUIRE(status == GNSILU_SUCCESS, describe(status));
    } else {
      const char* v = gnsilu_version();
      REQUIRE(v != nullptr && std::strlen(v) >= 5, "version");
    }
  }
  return 0;
}
