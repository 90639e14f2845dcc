// What moves between cache files and machines (transfer.hpp): a cache's contents in memory, and the one error
// that reading, writing and merging them report.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "cache/entries.hpp"

namespace gnsilu::cache {

// Bad input or a failed read or write, naming the file (or store) and what is wrong with it.
class TransferError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // "source: problem".
  TransferError(const std::string& source, const std::string& problem)
      : std::runtime_error(source + ": " + problem) {}
};

struct KernelRecord {
  KernelKey key;
  KernelImage image;
};

// What a cache holds, in memory.
struct Bundle {
  std::vector<TuningEntry> tuning;
  std::vector<KernelRecord> kernels;
};

}  // namespace gnsilu::cache
