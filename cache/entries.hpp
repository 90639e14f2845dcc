// What the persistent cache stores: tuned launch configurations (with every candidate's timing) and compiled
// kernels, and the keys they are stored under. Keys are explicit fields (columns in SQLite), never an opaque
// blob, so a cache can be listed, compared and merged.
#pragma once

#include <fmt/core.h>

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <span>
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

// What an entry's timings were taken on: the (possibly sliced) shape, its groups and the path it ran. Typed in
// files of schema 4 and later (columns tuned_dims, tuned_groups, path) and in exports ("tuned_dims",
// "tuned_groups", "path"); text() is only for people to read.
struct TunedShape {
  std::vector<int64_t> dims;     // empty: not known (an entry of an older file whose text could not be read)
  int64_t groups = 0;            // 0: not known
  Path path = Path::Auto;        // Fused or Split when the tuner recorded it; Auto: not recorded
  friend bool operator==(const TunedShape&, const TunedShape&) = default;
  // "1x512x16384 G=32" ("" when the dims are not known).
  std::string text() const;
};
std::ostream& operator<<(std::ostream& out, const TunedShape& shape);  // text()

struct TuningEntry {
  TuningKey key;
  LaunchConfig winner;
  double default_us = 0;
  double best_us = 0;
  double noise_us = 0;
  TunedShape tuned_shape;
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
// The lowered names as the kernels table and the checksum hold them (one per line), and back: the one pair the
// store and export files both use, so that their checksums agree.
std::string join_lowered_names(const std::vector<std::string>& names);
std::vector<std::string> split_lowered_names(const std::string& text);

// "1x512x16384" <-> dims: the one text form of a shape (cache files' tuned_dims, gnsilu-tune's arguments and
// output). shape_from_text takes what shape_to_text writes (leading zeros too) and nothing else: nullopt for an
// empty text or part, a sign or any other character, a dimension that is 0 or beyond int64_t; `problem` (when
// given) then says which part and why ("\"a\" is not a positive whole number", "\"0\" is out of range").
std::string shape_to_text(std::span<const int64_t> dims);
std::optional<std::vector<int64_t>> shape_from_text(std::string_view text, std::string* problem = nullptr);

// The one reader of the text that files of schema 3 and before (column tuned_shape) and exports without
// "tuned_dims" hold: "1x512x16384 G=32" -> dims and groups (none for text that does not read as that), and the
// path from the size class ("...-fused": Fused, anything else: Split, as gnsilu-tune read it before the path was
// stored). Used by the schema 4 migration, by rows that a process of an older schema saved into a migrated
// file, and by parse_export; everything else uses the typed fields.
TunedShape tuned_shape_from_legacy(std::string_view text, std::string_view size_class);

}  // namespace gnsilu::cache

// Log lines name a tuned shape by its text.
template <>
struct fmt::formatter<gnsilu::cache::TunedShape> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(const gnsilu::cache::TunedShape& shape, FormatContext& ctx) const -> decltype(ctx.out()) {
    const std::string text = shape.text();
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(text), ctx);
  }
};
