#include "tuning/keys.hpp"

#include "runtime/kernels.hpp"

namespace gnsilu::detail {

cache::DeviceIdentity identity_of(const DeviceInfo& device) {
  cache::DeviceIdentity id;
  id.name = device.name;
  id.arch = device.arch();
  id.sms = device.sms;
  id.memory_mib = static_cast<int64_t>(device.total_memory >> 20);
  id.l2_kib = device.l2_bytes >> 10;
  return id;
}

cache::TuningKey tuning_key(const DeviceInfo& device, const Geometry& g, DType x, DType y, Path path,
                            Activation activation) {
  cache::TuningKey k;
  k.device = identity_of(device);
  k.code_version = code_version();
  k.channels_per_group = g.channels_per_group;
  k.x_dtype = x;
  k.y_dtype = y;
  k.layout = g.layout;
  k.activation = activation;
  k.size_class = cache::size_class_of(static_cast<std::size_t>(g.numel) * (dtype_size(x) + dtype_size(y)),
                                      static_cast<std::size_t>(device.l2_bytes), path_name(path));
  return k;
}

cache::TuningKey tuning_key(const Call& call) {
  return tuning_key(call.device, call.geometry, call.problem.x_dtype, call.problem.y_dtype, call.path,
                    call.problem.activation);
}

std::size_t activation_bytes(const Call& c) {
  return static_cast<std::size_t>(c.geometry.numel) * (dtype_size(c.problem.x_dtype) + dtype_size(c.problem.y_dtype));
}

bool fits_l2(std::size_t bytes, const DeviceInfo& device) { return bytes <= static_cast<std::size_t>(device.l2_bytes); }

}  // namespace gnsilu::detail
