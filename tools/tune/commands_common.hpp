// What the subcommand files of gnsilu-tune share (commands_warm, commands_inspect, commands_transfer,
// commands_verify, and report.cpp's run_report): opening cache files, the values several results hold, and the
// kernel check of verify --kernels and import --verify-kernels. Printing a result: emit (tune.hpp, output.cpp).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cache/store.hpp"
#include "cache/transfer/transfer.hpp"
#include "commands.hpp"
#include "tune.hpp"

namespace gnsilu::tune {

class GpuSession;

bool file_exists(const std::string& path);

// A cache file opened for reading (one of an older schema through an upgraded copy in memory: reading never
// changes it), or for writing; CliError(kBadInput) when it is missing or unusable, or the cache is off ("").
std::unique_ptr<cache::Store> open_for_reading(const std::string& path);
std::unique_ptr<cache::Store> open_for_writing(const std::string& path);
// Every tuned entry of the cache file at `path` (CliError(kBadInput) as open_for_reading).
std::vector<cache::TuningEntry> entries_of(const std::string& path);
// Makes `path` the process cache's user file (the library's own lookups then read and write it).
void use_cache_file(const std::string& path);

// The default's time over the winner's (1 when the winner's is not known).
double speedup(const cache::TuningEntry& e);
// {"name", "arch", "sms", "memory_mib", "l2_kib"} of the session's device.
nlohmann::json device_json(const GpuSession& gpu);

// A cached kernel against its rebuild (in commands_verify.cpp): NVRTC gives the same bytes for the same source,
// options and NVRTC version (the code version holds all three), so any difference means the bytes were not made
// by this source.
struct KernelCheck {
  cache::KernelKey key;
  std::string status;  // "same", "differs", "other kernel version", "unknown variant", "compile failed: ..."
};

// Every kernel rebuilt and compared, a progress line each (unless quiet or --json).
std::vector<KernelCheck> check_kernels(const std::vector<cache::KernelRecord>& kernels, const Common& common);
int count_status(const std::vector<KernelCheck>& checks, const std::string& status);

}  // namespace gnsilu::tune
