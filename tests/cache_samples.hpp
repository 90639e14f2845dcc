// What the cache, transfer and gnsilu-tune tests build their files from: a tuning key of an H200, an entry for it
// (two candidates timed, one that failed) and reading or writing a file's bytes. Each test sets on top the
// fields its assertions are about.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include "cache/entries.hpp"

namespace testing {

inline gnsilu::cache::TuningKey sample_key(int64_t channels_per_group, const std::string& code_version,
                                           const std::string& device = "NVIDIA H200") {
  gnsilu::cache::TuningKey k;
  k.device = {device, 90, 132, 143771, 61440};
  k.code_version = code_version;
  k.channels_per_group = channels_per_group;
  k.size_class = "dram-split";
  return k;
}

// Tuned on 1x512x16384 with 32 groups (split path): the default took 300 us, `winner` 250 us.
inline gnsilu::cache::TuningEntry sample_entry(const gnsilu::cache::TuningKey& key, const gnsilu::LaunchConfig& winner,
                                               double noise_us) {
  gnsilu::cache::TuningEntry e;
  e.key = key;
  e.winner = winner;
  e.default_us = 300;
  e.best_us = 250;
  e.noise_us = noise_us;
  e.tuned_shape = {{1, 512, 16384}, 32, gnsilu::Path::Split};
  e.library_version = "0.1.0";
  e.created_at = 1700000000;
  e.candidates = {{{16, 4, 2, 8}, 300, 2, 9, "ok"}, {winner, 250, 1, 9, "ok"}, {{32, 16, 1, 2}, 0, 0, 0, "wrong output"}};
  return e;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

}  // namespace testing
