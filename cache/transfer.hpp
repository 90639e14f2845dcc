// Moving cache contents between files and machines (gnsilu-tune export / import / merge): a portable export
// file (JSON: tuned entries with every candidate's timing, compiled kernels in base64 with checksums), reading
// either an export file or a SQLite cache file, and merging with conflicts resolved toward the better-measured
// entry. Everything here reports bad input as TransferError naming the file and what is wrong with it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cache/entries.hpp"

namespace gnsilu::cache {

class Store;

class TransferError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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

constexpr std::string_view kExportFormat = "gnsilu-cache-export";
// 2: keys carry "layout" and "activation". Version 1 files (without them) still read, as nchw / silu; a gnsilu
// that reads only version 1 refuses version 2 files rather than take channels-last or plain GroupNorm entries
// for channels-first GroupNorm+SiLU ones.
// Entries also carry what they were tuned on, typed: "tuned_dims" (an array), "tuned_groups" and "path" ("fused",
// "split"; "auto" when not recorded), beside the display text "tuned_shape" that every version has. They are
// additions that readers of version 2 ignore, so the version stays 2; a file without them (version 1, or 2 as
// written before schema 4) is read through its "tuned_shape" text and the key's size class
// (tuned_shape_from_legacy).
constexpr int kExportVersion = 2;

// The export format's JSON of a key, a launch configuration and a candidate's timing (gnsilu-tune's --json
// output uses the same fields).
nlohmann::json key_json(const TuningKey& key);
nlohmann::json config_json(const LaunchConfig& config);
nlohmann::json candidate_json(const CandidateTiming& candidate);

// Everything `store` holds (kernels only when `with_kernels`).
// Kernels of a file that fails the trust check (trust.hpp) are left out unless `untrusted_kernels` (for
// inspecting them: gnsilu-tune verify --kernels).
Bundle bundle_of(Store& store, bool with_kernels, bool untrusted_kernels = false);

// An export file or a SQLite cache file (told apart by the first bytes; a cache file of an older schema is read
// through an upgraded copy in memory, Store::read_upgraded). Throws TransferError.
Bundle read_bundle(const std::string& path, bool with_kernels = true, bool untrusted_kernels = false);

// The export format as text, and back (`what` names the source in errors). parse_export throws TransferError
// for anything that is not a well-formed export of a known version: wrong types, unknown dtypes, layouts or
// activations, configurations out of range, kernels whose checksum does not match.
std::string export_text(const Bundle& bundle);
Bundle parse_export(std::string_view text, const std::string& what);

// Writes an export file atomically (a temporary file renamed over `path`). Throws TransferError.
void write_export(const Bundle& bundle, const std::string& path);

// Whether `a` was measured better than `b` (two entries for the same key): more candidates timed successfully;
// then a smaller noise relative to the winner's time; then the newer one. Equal measurements: false.
bool better_measured(const TuningEntry& a, const TuningEntry& b);

struct Conflict {
  TuningKey key;
  LaunchConfig kept;
  LaunchConfig dropped;
  bool incoming_kept = false;  // the incoming entry replaced the existing one
};

struct MergeReport {
  int added = 0;      // keys that were not there
  int replaced = 0;   // existing entries replaced by better-measured incoming ones
  int kept = 0;       // existing entries kept over worse-measured incoming ones
  int identical = 0;  // incoming entries equal to what was there
  int kernels_added = 0;
  int kernels_identical = 0;
  int kernels_replaced = 0;
  std::vector<Conflict> conflicts;  // every key present on both sides with different measurements
};

// Merges `incoming` into `into` (in memory).
MergeReport merge(Bundle& into, const Bundle& incoming);

// Merges `incoming` into a writable store (nothing is written when `dry_run`). Throws TransferError when the
// store cannot be read or written.
MergeReport merge_into(Store& store, const Bundle& incoming, bool dry_run = false);

// Entries (and kernels) of `bundle` that a machine with `device` (none: any) running kernels of `code_version`
// cannot use, moved out of `bundle` into the returned bundle.
Bundle take_mismatched(Bundle& bundle, const std::optional<DeviceIdentity>& device, const std::string& code_version);

}  // namespace gnsilu::cache
