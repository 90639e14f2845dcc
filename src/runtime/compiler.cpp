#include "runtime/compiler.hpp"

#include <nvrtc.h>

#include <algorithm>
#include <memory>

#include "base/errors.hpp"
#include "base/faults.hpp"
#include "base/text.hpp"
#include "runtime/kernel_sources.hpp"

namespace gnsilu::detail {
namespace {

struct ProgramDeleter {
  void operator()(_nvrtcProgram* program) const noexcept {
    nvrtcProgram p = program;
    nvrtcDestroyProgram(&p);
  }
};
using Program = std::unique_ptr<_nvrtcProgram, ProgramDeleter>;

std::string program_log(nvrtcProgram program) {
  std::size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size == 0) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) return {};
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

const EmbeddedFile* find_file(const char* name) {
  for (std::size_t i = 0; i < kKernelFileCount; ++i) {
    if (std::string(kKernelFiles[i].name) == name) return &kKernelFiles[i];
  }
  return nullptr;
}

}  // namespace

const std::vector<int>& supported_archs() {
  static const std::vector<int> archs = [] {
    int count = 0;
    std::vector<int> out;
    if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0) return out;
    out.resize(static_cast<std::size_t>(count));
    if (nvrtcGetSupportedArchs(out.data()) != NVRTC_SUCCESS) out.clear();
    std::sort(out.begin(), out.end());
    return out;
  }();
  return archs;
}

std::string nvrtc_version() {
  int major = 0;
  int minor = 0;
  nvrtcVersion(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

std::vector<std::string> fixed_options(int arch, bool cubin) {
  return {
      std::string("--gpu-architecture=") + (cubin ? "sm_" : "compute_") + std::to_string(arch),
      "--std=c++17",
      "--fmad=false",      // no contraction: every multiply-add is two roundings unless written fma32
      "--ftz=false",       // subnormals kept
      "--prec-div=true",   // IEEE division
      "--prec-sqrt=true",  // IEEE square root
  };
}

CompiledProgram compile(const CompileRequest& request) {
  if (request.arch < 75) {
    throw Error(Status::UnsupportedDevice, "gnsilu: compute capability " + std::to_string(request.arch / 10) + "." +
                                               std::to_string(request.arch % 10) + " is below 7.5");
  }
  const auto& archs = supported_archs();
  CompiledProgram out;
  out.arch = request.arch;
  // An architecture newer than this NVRTC knows gets PTX of the newest one it knows; the driver compiles it.
  const bool known = archs.empty() || std::find(archs.begin(), archs.end(), request.arch) != archs.end() ||
                     request.arch < archs.back();
  out.is_cubin = known && !request.ptx_only;
  const int target = known ? request.arch : archs.back();

  const EmbeddedFile* main_file = find_file("group_norm_silu.cu");
  if (main_file == nullptr) throw Error(Status::Internal, "gnsilu: group_norm_silu.cu is not embedded");
  const bool own_source = !request.source.empty();
  std::vector<const char*> header_texts;
  std::vector<const char*> header_names;
  for (std::size_t i = 0; i < kKernelFileCount; ++i) {
    if (&kKernelFiles[i] == main_file && !own_source) continue;
    header_texts.push_back(kKernelFiles[i].text);
    header_names.push_back(kKernelFiles[i].name);
  }
  nvrtcProgram raw = nullptr;
  GNSILU_CHECK(nvrtcCreateProgram(&raw, own_source ? request.source.c_str() : main_file->text,
                                  own_source ? "program.cu" : main_file->name, static_cast<int>(header_texts.size()),
                                  header_texts.data(), header_names.data()));
  Program program(raw);
  std::vector<std::string> unique_names;
  for (const auto& name : request.names) {
    if (std::find(unique_names.begin(), unique_names.end(), name) != unique_names.end()) continue;
    unique_names.push_back(name);
    GNSILU_CHECK(nvrtcAddNameExpression(raw, name.c_str()));
  }

  std::vector<std::string> options = fixed_options(target, out.is_cubin);
  options.insert(options.end(), request.extra_options.begin(), request.extra_options.end());
  if (take_fault(Fault::Compile)) options.push_back("--gnsilu-injected-fault");
  std::vector<const char*> option_ptrs;
  option_ptrs.reserve(options.size());
  for (const auto& o : options) option_ptrs.push_back(o.c_str());
  out.options = join(options, " ");

  const nvrtcResult result = nvrtcCompileProgram(raw, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  out.log = program_log(raw);
  if (result != NVRTC_SUCCESS) {
    throw CompileError("gnsilu: NVRTC failed to compile the kernels for " + std::string(out.is_cubin ? "sm_" : "compute_") +
                           std::to_string(target) + ": " + nvrtcGetErrorString(result) + "\n" + out.log,
                       out.log, out.options);
  }
  for (const auto& name : request.names) {
    const char* lowered = nullptr;
    GNSILU_CHECK(nvrtcGetLoweredName(raw, name.c_str(), &lowered));
    out.lowered_names.emplace_back(lowered);
  }
  std::size_t size = 0;
  if (out.is_cubin) {
    GNSILU_CHECK(nvrtcGetCUBINSize(raw, &size));
    out.image.resize(size);
    GNSILU_CHECK(nvrtcGetCUBIN(raw, out.image.data()));
  } else {
    GNSILU_CHECK(nvrtcGetPTXSize(raw, &size));
    out.image.resize(size);
    GNSILU_CHECK(nvrtcGetPTX(raw, out.image.data()));
  }
  return out;
}

}  // namespace gnsilu::detail
