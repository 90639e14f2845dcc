// Atomic file writes: a temporary file renamed over the target (atomic_file.hpp).
#include "cache/transfer/atomic_file.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace gnsilu::detail {

std::optional<std::string> write_file_atomically(const std::string& path, std::string_view contents) {
  const std::string temp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return "cannot be created (" + temp + " could not be opened for writing)";
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) {
      out.close();
      std::remove(temp.c_str());
      return "writing failed (disk full?)";
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    return "cannot be replaced (rename failed)";
  }
  return std::nullopt;
}

}  // namespace gnsilu::detail
