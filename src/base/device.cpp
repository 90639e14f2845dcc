#include "base/device.hpp"

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#include "base/driver.hpp"
#include "base/errors.hpp"

namespace gnsilu::detail {

const DeviceInfo& device_info(CUdevice device) {
  static std::mutex mutex;
  static std::map<CUdevice, std::unique_ptr<DeviceInfo>> cache;
  std::lock_guard lock(mutex);
  auto& slot = cache[device];
  if (slot) return *slot;
  const Driver& d = driver();
  auto info = std::make_unique<DeviceInfo>();
  info->device = device;
  info->ordinal = static_cast<int>(device);
  char name[256] = {};
  GNSILU_CHECK(d.cuDeviceGetName(name, sizeof name - 1, device));
  info->name = name;
  CUuuid uuid{};
  GNSILU_CHECK(d.cuDeviceGetUuid_v2(&uuid, device));
  for (unsigned char byte : uuid.bytes) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", byte);
    info->uuid += hex;
  }
  GNSILU_CHECK(d.cuDeviceGetAttribute(&info->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device));
  GNSILU_CHECK(d.cuDeviceGetAttribute(&info->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device));
  GNSILU_CHECK(d.cuDeviceGetAttribute(&info->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));
  GNSILU_CHECK(d.cuDeviceGetAttribute(&info->l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device));
  GNSILU_CHECK(d.cuDeviceTotalMem_v2(&info->total_memory, device));
  slot = std::move(info);
  return *slot;
}

namespace {

// Primary contexts this library retained (one per device, kept for the life of the process).
CUcontext primary_context(CUdevice device) {
  static std::mutex mutex;
  static std::map<CUdevice, CUcontext> retained;
  std::lock_guard lock(mutex);
  auto it = retained.find(device);
  if (it != retained.end()) return it->second;
  CUcontext context = nullptr;
  GNSILU_CHECK(driver().cuDevicePrimaryCtxRetain(&context, device));
  retained[device] = context;
  return context;
}

}  // namespace

ContextScope::ContextScope(const void* hint) {
  const Driver& d = driver();
  GNSILU_CHECK(d.cuCtxGetCurrent(&context_));
  if (context_ == nullptr) {
    int ordinal = -1;
    CUpointer_attribute attribute = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    void* data[] = {&ordinal};
    if (hint == nullptr ||
        d.cuPointerGetAttributes(1, &attribute, data, reinterpret_cast<CUdeviceptr>(hint)) != CUDA_SUCCESS ||
        ordinal < 0) {
      int count = 0;
      GNSILU_CHECK(d.cuDeviceGetCount(&count));
      if (count == 0) throw Error(Status::NoDevice, "gnsilu: no CUDA device");
      throw_invalid("x", "no CUDA context is current on this thread and x is not device memory");
    }
    CUdevice device = 0;
    GNSILU_CHECK(d.cuDeviceGet(&device, ordinal));
    context_ = primary_context(device);
    GNSILU_CHECK(d.cuCtxPushCurrent_v2(context_));
    pushed_ = true;
  }
  GNSILU_CHECK(d.cuCtxGetDevice(&device_));
}

ContextScope::~ContextScope() {
  if (pushed_) {
    CUcontext popped = nullptr;
    log_dropped(driver().cuCtxPopCurrent_v2(&popped), "cuCtxPopCurrent (the call's context)");
  }
}

bool Range::overlaps(const Range& other) const {
  if (begin == nullptr || other.begin == nullptr || bytes == 0 || other.bytes == 0) return false;
  const auto a = reinterpret_cast<std::uintptr_t>(begin);
  const auto b = reinterpret_cast<std::uintptr_t>(other.begin);
  return a < b + other.bytes && b < a + bytes;
}

void check_device_range(const char* name, const void* pointer, std::size_t bytes, const DeviceInfo& device) {
  const Driver& d = driver();
  unsigned memory_type = 0;
  int ordinal = -1;
  CUdeviceptr start = 0;
  std::size_t size = 0;
  int managed = 0;
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                      CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* data[] = {&memory_type, &ordinal, &start, &size, &managed};
  const CUresult result =
      d.cuPointerGetAttributes(5, attributes, data, reinterpret_cast<CUdeviceptr>(pointer));
  if (result != CUDA_SUCCESS || memory_type == 0) {
    throw_invalid(name, "is not CUDA memory (a host pointer, or freed)");
  }
  if (memory_type != CU_MEMORYTYPE_DEVICE && !managed) {
    throw_invalid(name, "is host memory; gnsilu needs device or managed memory");
  }
  if (!managed && ordinal != device.ordinal) {
    throw_invalid(name, "lives on device " + std::to_string(ordinal) + " but the current context is on device " +
                            std::to_string(device.ordinal));
  }
  const auto p = reinterpret_cast<std::uintptr_t>(pointer);
  if (size != 0 && (p < start || p + bytes > start + size)) {
    throw_invalid(name, "needs " + std::to_string(bytes) + " bytes but its allocation ends " +
                            std::to_string(start + size - p) + " bytes after it");
  }
}

uint64_t context_id(CUcontext context) {
  unsigned long long id = 0;
  GNSILU_CHECK(driver().cuCtxGetId(context, &id));
  return id;
}

}  // namespace gnsilu::detail
