// The merge policy (gnsilu-tune merge / import): entries for the same key resolved toward the better-measured
// one, every such conflict reported; kernels for the same key replaced by the incoming image when they differ.
#pragma once

#include <vector>

#include "cache/transfer/bundle.hpp"
#include "cache/entries.hpp"

namespace gnsilu::cache {

class Store;

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

}  // namespace gnsilu::cache
