// The merge policy: which of two entries for a key was measured better, and merging bundles and stores by it
// (merge.hpp).
#include "cache/transfer/merge.hpp"

#include <algorithm>
#include <limits>

#include "cache/store.hpp"

namespace gnsilu::cache {
namespace {

int ok_candidates(const TuningEntry& e) {
  int n = 0;
  for (const auto& c : e.candidates) n += c.status == "ok";
  return n;
}

bool same_measurement(const TuningEntry& a, const TuningEntry& b) {
  return a.winner == b.winner && a.best_us == b.best_us && a.default_us == b.default_us &&
         a.noise_us == b.noise_us && a.created_at == b.created_at;
}

bool same_kernel(const KernelImage& a, const KernelImage& b) {
  return a.image == b.image && a.lowered_names == b.lowered_names && a.is_cubin == b.is_cubin;
}

// The element of `records` (tuning entries or kernel records) whose key is `key`, or end().
template <class Record, class Key>
auto find_key(std::vector<Record>& records, const Key& key) {
  return std::find_if(records.begin(), records.end(), [&](const Record& x) { return x.key == key; });
}

[[noreturn]] void store_failed(const Store& store) { throw TransferError(store.path(), store.problem()); }

}  // namespace

bool better_measured(const TuningEntry& a, const TuningEntry& b) {
  const int ok_a = ok_candidates(a), ok_b = ok_candidates(b);
  if (ok_a != ok_b) return ok_a > ok_b;
  auto relative_noise = [](const TuningEntry& e) {
    return e.best_us > 0 ? e.noise_us / e.best_us : std::numeric_limits<double>::infinity();
  };
  const double na = relative_noise(a), nb = relative_noise(b);
  if (na != nb) return na < nb;
  return a.created_at > b.created_at;
}

MergeReport merge(Bundle& into, const Bundle& incoming) {
  MergeReport report;
  for (const auto& e : incoming.tuning) {
    auto it = find_key(into.tuning, e.key);
    if (it == into.tuning.end()) {
      into.tuning.push_back(e);
      ++report.added;
    } else if (same_measurement(*it, e)) {
      ++report.identical;
    } else if (better_measured(e, *it)) {
      report.conflicts.push_back({e.key, e.winner, it->winner, true});
      *it = e;
      ++report.replaced;
    } else {
      report.conflicts.push_back({e.key, it->winner, e.winner, false});
      ++report.kept;
    }
  }
  for (const auto& k : incoming.kernels) {
    auto it = find_key(into.kernels, k.key);
    if (it == into.kernels.end()) {
      into.kernels.push_back(k);
      ++report.kernels_added;
    } else if (same_kernel(it->image, k.image)) {
      ++report.kernels_identical;
    } else {
      // Same sources, options and NVRTC version give the same code; a difference means another NVRTC build.
      it->image = k.image;
      ++report.kernels_replaced;
    }
  }
  return report;
}

MergeReport merge_into(Store& store, const Bundle& incoming, bool dry_run) {
  if (!store.usable()) store_failed(store);
  if (!dry_run && !store.writable()) store_failed(store);
  // Merge against what the store holds for the incoming keys, then write only what changed.
  Bundle current;
  for (const auto& e : incoming.tuning) {
    if (auto existing = store.find_tuning(e.key)) current.tuning.push_back(std::move(*existing));
  }
  for (const auto& k : incoming.kernels) {
    if (auto existing = store.find_kernel(k.key)) current.kernels.push_back({k.key, std::move(*existing)});
  }
  if (!store.usable()) store_failed(store);
  Bundle merged = current;
  MergeReport report = merge(merged, incoming);
  if (dry_run) return report;
  for (const auto& e : merged.tuning) {
    auto before = find_key(current.tuning, e.key);
    if (before != current.tuning.end() && same_measurement(*before, e)) continue;
    if (!store.put_tuning(e)) store_failed(store);
  }
  for (const auto& k : merged.kernels) {
    auto before = find_key(current.kernels, k.key);
    if (before != current.kernels.end() && same_kernel(before->image, k.image)) continue;
    if (!store.put_kernel(k.key, k.image)) store_failed(store);
  }
  return report;
}

}  // namespace gnsilu::cache
