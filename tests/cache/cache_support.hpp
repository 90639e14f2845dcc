// What the cache tests (tests/cache/test_*.cpp, one executable: test_cache) build on: the headers they use, a key, an
// entry with fractional times and a large tuned shape (so that round trips of every field show), and a populated
// file. Included by those six files only, so it also brings their names into scope (the using lines at the end).
#pragma once

#include <doctest/doctest.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <SQLiteCpp/SQLiteCpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/log.hpp"
#include "cache/cache.hpp"
#include "cache/lease.hpp"
#include "cache/store.hpp"
#include "cache_samples.hpp"
#include "temp_dir.hpp"

namespace cache_tests {

using gnsilu::cache::Store;
using gnsilu::cache::TuningEntry;
using gnsilu::cache::TuningKey;
using testing::TempDir;

inline TuningKey key(int64_t cpg = 4, const std::string& device = "NVIDIA H200") {
  return testing::sample_key(cpg, "abc123-0011223344556677", device);  // bf16 in and out
}

// Fractional times and a large shape, so that round trips of every field show.
inline TuningEntry entry(const TuningKey& k, int warps = 4) {
  TuningEntry e = testing::sample_entry(k, {8, warps, 2, 8}, 2.5);
  e.default_us = 300.5;
  e.best_us = 250.25;
  e.tuned_shape = {{1, 128, 1024, 1024}, 32, gnsilu::Path::Split};
  e.created_at = 1764430000;
  e.candidates = {{{16, 8, 1, 4}, 300.5, 2.0, 15, "ok"}, {{8, warps, 2, 8}, 250.25, 2.5, 15, "ok"},
                  {{32, 16, 1, 2}, 0, 0, 0, "failed: compile error"}};
  return e;
}

// A populated cache file (rollback journal, so that its bytes are all in the one file).
inline std::string populated(const TempDir& dir, const std::string& name, int entries) {
  const std::string path = dir.file(name);
  {
    Store s(path, Store::Mode::ReadWrite);
    REQUIRE(s.writable());
    for (int i = 0; i < entries; ++i) REQUIRE(s.put_tuning(entry(key(i + 1))));
    REQUIRE(s.put_kernel({90, "v", "bf16-bf16-e16-w8-s1"}, {true, std::vector<char>(5000, 'k'), {"a", "b", "c", "d"}, "--fmad=false", "13.0"}));
  }
  SQLite::Database db(path, SQLite::OPEN_READWRITE);
  db.exec("PRAGMA journal_mode = DELETE");
  return path;
}

}  // namespace cache_tests

using namespace gnsilu::cache;  // the six test files' shared scope
using namespace cache_tests;
namespace fs = std::filesystem;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;
