// What the persistent cache stores: tuned launch configurations (with every candidate's timing) and compiled
// kernels, and the keys they are stored under. Keys are explicit fields (columns in SQLite), never an opaque
// blob, so a cache can be listed, compared and merged.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gnsilu/gnsilu.hpp"

namespace gnsilu::cache {

// What makes two GPUs differ for tuning purposes.
struct DeviceIdentity {
  std::string name;          // "NVIDIA H200"
  int arch = 0;              // compute capability * 10
  int sms = 0;               // multiprocessors
  int64_t memory_mib = 0;    // total device memory
  int l2_kib = 0;            // L2 cache size
  friend bool operator==(const DeviceIdentity&, const DeviceIdentity&) = default;
};

struct TuningKey {
  DeviceIdentity device;
  std::string code_version;      // kernel sources, compile options and NVRTC version (code_version())
  int64_t channels_per_group = 0;
  DType x_dtype = DType::BF16;
  DType y_dtype = DType::BF16;
  std::string size_class;        // size_class_of(): activations of different classes (and paths) tune separately
  Layout layout = Layout::ChannelsFirst;     // the kernels' layout (channels-last tunes separately)
  Activation activation = Activation::SiLU;  // SiLU or none
  friend bool operator==(const TuningKey&, const TuningKey&) = default;
  // One line naming every field, usable as a map key and in messages.
  std::string text() const;
};

struct CandidateTiming {
  LaunchConfig config;
  double median_us = 0;   // 0 when it did not run
  double noise_us = 0;
  int samples = 0;
  std::string status;     // "ok", or why it was skipped ("compile failed: ...", "wrong output", ...)
};

struct TuningEntry {
  TuningKey key;
  LaunchConfig winner;
  double default_us = 0;
  double best_us = 0;
  double noise_us = 0;
  std::string tuned_shape;       // the (possibly sliced) shape the timings were taken on
  std::string library_version;
  int64_t created_at = 0;        // unix seconds
  std::vector<CandidateTiming> candidates;
};

struct KernelKey {
  int arch = 0;
  std::string code_version;
  std::string variant;           // "bf16-bf16-e16-w8-s1": what the image instantiates
  friend bool operator==(const KernelKey&, const KernelKey&) = default;
};

struct KernelImage {
  bool is_cubin = true;
  std::vector<char> image;
  std::vector<std::string> lowered_names;
  std::string options;
  std::string nvrtc_version;
};

// The size class of an activation of `bytes` bytes (x and y together) on a GPU with `l2_bytes` of L2, run on the
// path `path` (path_name: "fused" or "split"): "l2-fused", "l2-split", "dram-split", ...
// Winners differ between them (docs/PERFORMANCE.md), so they tune separately.
std::string size_class_of(std::size_t bytes, std::size_t l2_bytes, std::string_view path);

// FNV-1a over a kernel image and its lowered names joined by newlines, as 16 hex digits: SQLite checks its
// pages' structure, not the bytes of a blob, and a damaged kernel image must never be loaded.
std::string kernel_checksum(const std::vector<char>& image, const std::string& joined_names);

// "bf16" <-> DType
DType dtype_from_name(const std::string& name);
// "nchw" / "nhwc" (layout_name) -> Layout, and "silu" / "none" -> Activation; false for anything else.
bool layout_from_name(const std::string& name, Layout& layout);
bool activation_from_name(const std::string& name, Activation& activation);

}  // namespace gnsilu::cache
