// A private folder under /tmp for one test, removed with everything in it at the end of the test.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const char* tag = "test") {
    std::string pattern = std::string("/tmp/gnsilu-") + tag + "-XXXXXX";
    path = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace testing
