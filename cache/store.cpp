// A cache file's rows: tuned configurations with their timings, compiled kernels and tuning leases (store.hpp).
// Opening, health and the triage of SQLite failures are in store_open.cpp, the schema in schema.cpp.
#include "cache/store.hpp"

#include <SQLiteCpp/SQLiteCpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <sstream>
#include <stop_token>

#include "base/log.hpp"
#include "base/names.hpp"

namespace gnsilu::cache {
namespace {

const char* kKeyWhere =
    "device_name = ? AND device_arch = ? AND device_sms = ? AND device_memory_mib = ? AND device_l2_kib = ? AND "
    "code_version = ? AND channels_per_group = ? AND x_dtype = ? AND y_dtype = ? AND size_class = ? AND layout = ? AND "
    "activation = ?";
constexpr int kKeyColumns = 12;  // the ? of kKeyWhere, bound by bind_key

void bind_key(SQLite::Statement& s, const TuningKey& k, int first = 1) {
  s.bind(first + 0, k.device.name);
  s.bind(first + 1, k.device.arch);
  s.bind(first + 2, k.device.sms);
  s.bind(first + 3, static_cast<int64_t>(k.device.memory_mib));
  s.bind(first + 4, k.device.l2_kib);
  s.bind(first + 5, k.code_version);
  s.bind(first + 6, static_cast<int64_t>(k.channels_per_group));
  s.bind(first + 7, std::string(dtype_name(k.x_dtype)));
  s.bind(first + 8, std::string(dtype_name(k.y_dtype)));
  s.bind(first + 9, k.size_class);
  s.bind(first + 10, std::string(layout_name(k.layout)));
  s.bind(first + 11, std::string(activation_name(k.activation)));
}

// Whether a key's layout and activation (and the entry's tuned path) are values this gnsilu names (a key built
// from anything else would be stored as "unknown" and never read back).
bool known_key(const TuningKey& k) {
  return detail::layout_from_name(layout_name(k.layout)) && detail::activation_from_name(activation_name(k.activation));
}

// Whether what an entry was tuned on reads back as written: a path with a name, positive dims.
bool storable(const TunedShape& t) {
  return detail::path_from_name(path_name(t.path)) &&
         std::all_of(t.dims.begin(), t.dims.end(), [](int64_t d) { return d > 0; });
}

// An entry from a row of kEntryColumns; false (and `e` partly filled) for a row whose layout, activation or path
// this gnsilu does not know: no key of this gnsilu can name it, so it is not an entry here.
bool read_entry(SQLite::Statement& q, TuningEntry& e) {
  e.key.device.name = q.getColumn(1).getString();
  e.key.device.arch = q.getColumn(2).getInt();
  e.key.device.sms = q.getColumn(3).getInt();
  e.key.device.memory_mib = q.getColumn(4).getInt64();
  e.key.device.l2_kib = q.getColumn(5).getInt();
  e.key.code_version = q.getColumn(6).getString();
  e.key.channels_per_group = q.getColumn(7).getInt64();
  e.key.x_dtype = detail::dtype_from_name(q.getColumn(8).getString()).value_or(DType::None);
  e.key.y_dtype = detail::dtype_from_name(q.getColumn(9).getString()).value_or(DType::None);
  e.key.size_class = q.getColumn(10).getString();
  e.winner = {q.getColumn(11).getInt(), q.getColumn(12).getInt(), q.getColumn(13).getInt(), q.getColumn(14).getInt()};
  e.default_us = q.getColumn(15).getDouble();
  e.best_us = q.getColumn(16).getDouble();
  e.noise_us = q.getColumn(17).getDouble();
  e.library_version = q.getColumn(19).getString();
  e.created_at = q.getColumn(20).getInt64();
  const std::string path = q.getColumn(25).getString();
  if (path.empty()) {
    // Saved by a process of schema 3 or before that had the file open when it was migrated (schema.cpp, step 4).
    e.tuned_shape = tuned_shape_from_legacy(q.getColumn(18).getString(), e.key.size_class);
  } else {
    e.tuned_shape.dims = shape_from_text(q.getColumn(23).getString()).value_or(std::vector<int64_t>{});
    e.tuned_shape.groups = q.getColumn(24).getInt64();
    const auto tuned_path = detail::path_from_name(path);
    if (!tuned_path) return false;
    e.tuned_shape.path = *tuned_path;
  }
  const auto layout = detail::layout_from_name(q.getColumn(21).getString());
  const auto activation = detail::activation_from_name(q.getColumn(22).getString());
  if (!layout || !activation) return false;
  e.key.layout = *layout;
  e.key.activation = *activation;
  return true;
}

const char* kEntryColumns =
    "id, device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version, channels_per_group, "
    "x_dtype, y_dtype, size_class, elems_per_load, warps, stages, programs_per_sm, default_us, best_us, noise_us, "
    "tuned_shape, library_version, created_at, layout, activation, tuned_dims, tuned_groups, path";

// Removes the entry of `key` and its timings, if there is one (inside the caller's transaction).
void delete_entry(SQLite::Database& db, const TuningKey& key) {
  SQLite::Statement old(db, std::string("SELECT id FROM tuning WHERE ") + kKeyWhere);
  bind_key(old, key);
  if (!old.executeStep()) return;
  const int64_t id = old.getColumn(0).getInt64();
  SQLite::Statement timings(db, "DELETE FROM timings WHERE tuning_id = ?");
  timings.bind(1, id);
  timings.exec();
  SQLite::Statement tuning(db, "DELETE FROM tuning WHERE id = ?");
  tuning.bind(1, id);
  tuning.exec();
}

void read_timings(SQLite::Database& db, int64_t id, TuningEntry& e) {
  SQLite::Statement t(db,
                      "SELECT elems_per_load, warps, stages, programs_per_sm, median_us, noise_us, samples, status "
                      "FROM timings WHERE tuning_id = ? ORDER BY rowid");
  t.bind(1, static_cast<int64_t>(id));
  while (t.executeStep()) {
    CandidateTiming c;
    c.config = {t.getColumn(0).getInt(), t.getColumn(1).getInt(), t.getColumn(2).getInt(), t.getColumn(3).getInt()};
    c.median_us = t.getColumn(4).getDouble();
    c.noise_us = t.getColumn(5).getDouble();
    c.samples = t.getColumn(6).getInt();
    c.status = t.getColumn(7).getString();
    e.candidates.push_back(std::move(c));
  }
}

}  // namespace

std::optional<TuningEntry> Store::find_tuning(const TuningKey& key) {
  std::lock_guard lock(mutex_);
  if (!db_ || health_ == Health::Unusable) return std::nullopt;
  try {
    SQLite::Statement q(*db_, std::string("SELECT ") + kEntryColumns + " FROM tuning WHERE " + kKeyWhere);
    bind_key(q, key);
    TuningEntry e;
    if (!q.executeStep() || !read_entry(q, e)) return std::nullopt;
    read_timings(*db_, q.getColumn(0).getInt64(), e);
    return e;
  } catch (const SQLite::Exception& e) {
    failed(e, Access::Finding);
    return std::nullopt;
  }
}

std::vector<TuningEntry> Store::all_tuning() {
  std::lock_guard lock(mutex_);
  std::vector<TuningEntry> out;
  if (!db_ || health_ == Health::Unusable) return out;
  try {
    SQLite::Statement q(*db_, std::string("SELECT ") + kEntryColumns + " FROM tuning ORDER BY id");
    while (q.executeStep()) {
      TuningEntry e;
      if (!read_entry(q, e)) continue;
      read_timings(*db_, q.getColumn(0).getInt64(), e);
      out.push_back(std::move(e));
    }
  } catch (const SQLite::Exception& e) {
    failed(e, Access::Listing);
  }
  return out;
}

bool Store::put_tuning(const TuningEntry& entry) {
  // Refused before any write (the store stays as it was): it could never be found again.
  if (!known_key(entry.key) || !storable(entry.tuned_shape)) return false;
  return run_write("a tuned configuration", [&] {
    delete_entry(*db_, entry.key);
    SQLite::Statement ins(*db_,
                          "INSERT INTO tuning (device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, "
                          "code_version, channels_per_group, x_dtype, y_dtype, size_class, layout, activation, "
                          "elems_per_load, warps, stages, programs_per_sm, default_us, best_us, noise_us, tuned_shape, "
                          "library_version, created_at, tuned_dims, tuned_groups, path) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    bind_key(ins, entry.key);
    constexpr int v = kKeyColumns + 1;  // the first value after the key
    ins.bind(v + 0, entry.winner.elems_per_load);
    ins.bind(v + 1, entry.winner.warps);
    ins.bind(v + 2, entry.winner.stages);
    ins.bind(v + 3, entry.winner.programs_per_sm);
    ins.bind(v + 4, entry.default_us);
    ins.bind(v + 5, entry.best_us);
    ins.bind(v + 6, entry.noise_us);
    ins.bind(v + 7, entry.tuned_shape.text());  // for people, and for processes of schema 3 (schema.cpp, step 4)
    ins.bind(v + 8, entry.library_version);
    ins.bind(v + 9, static_cast<int64_t>(entry.created_at));
    ins.bind(v + 10, shape_to_text(entry.tuned_shape.dims));
    ins.bind(v + 11, static_cast<int64_t>(entry.tuned_shape.groups));
    ins.bind(v + 12, std::string(path_name(entry.tuned_shape.path)));
    ins.exec();
    const int64_t id = db_->getLastInsertRowid();
    SQLite::Statement t(*db_,
                        "INSERT INTO timings (tuning_id, elems_per_load, warps, stages, programs_per_sm, median_us, "
                        "noise_us, samples, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
    for (const auto& c : entry.candidates) {
      t.bind(1, id);
      t.bind(2, c.config.elems_per_load);
      t.bind(3, c.config.warps);
      t.bind(4, c.config.stages);
      t.bind(5, c.config.programs_per_sm);
      t.bind(6, c.median_us);
      t.bind(7, c.noise_us);
      t.bind(8, c.samples);
      t.bind(9, c.status);
      t.exec();
      t.reset();
    }
  });
}

bool Store::remove_tuning(const TuningKey& key) {
  return run_write("a removal", [&] { delete_entry(*db_, key); });
}

std::optional<KernelImage> Store::find_kernel(const KernelKey& key) {
  std::lock_guard lock(mutex_);
  if (!db_ || health_ == Health::Unusable) return std::nullopt;
  if (!trust_.trusted) {
    if (!trust_warned_) {
      trust_warned_ = true;
      detail::logger().warn("cache file {}: its compiled kernels are not loaded, because {}: kernels are code that "
                            "runs in this process, so only a file nobody else could write is trusted for them. Its "
                            "tuned configurations are used; kernels are compiled again. Fix: chmod go-w the file "
                            "and its folder (owned by you or root), or set GNSILU_CACHE_TRUST=any if its writers "
                            "are trusted", path_, trust_.problem);
    }
    return std::nullopt;
  }
  return read_kernel_locked(key);
}

std::optional<KernelImage> Store::read_kernel(const KernelKey& key) {
  std::lock_guard lock(mutex_);
  if (!db_ || health_ == Health::Unusable) return std::nullopt;
  return read_kernel_locked(key);
}

std::optional<KernelImage> Store::read_kernel_locked(const KernelKey& key) {
  try {
    SQLite::Statement q(*db_,
                        "SELECT is_cubin, image, lowered_names, options, nvrtc_version, checksum FROM kernels "
                        "WHERE arch = ? AND code_version = ? AND variant = ?");
    q.bind(1, key.arch);
    q.bind(2, key.code_version);
    q.bind(3, key.variant);
    if (!q.executeStep()) return std::nullopt;
    KernelImage k;
    k.is_cubin = q.getColumn(0).getInt() != 0;
    const SQLite::Column blob = q.getColumn(1);
    const auto* bytes = static_cast<const char*>(blob.getBlob());
    k.image.assign(bytes, bytes + blob.getBytes());
    const std::string names = q.getColumn(2).getString();
    k.lowered_names = split_lowered_names(names);
    k.options = q.getColumn(3).getString();
    k.nvrtc_version = q.getColumn(4).getString();
    if (k.image.empty() || k.lowered_names.empty()) return std::nullopt;
    if (q.getColumn(5).getString() != kernel_checksum(k.image, names)) {
      detail::logger().warn("cache file {}: the compiled kernel {} for sm_{} does not match its checksum; ignored "
                            "(it is compiled again and saved over)", path_, key.variant, key.arch);
      return std::nullopt;
    }
    return k;
  } catch (const SQLite::Exception& e) {
    failed(e, Access::LoadingKernel);
    return std::nullopt;
  }
}

bool Store::put_kernel(const KernelKey& key, const KernelImage& k) {
  return run_write("a compiled kernel", [&] {
    SQLite::Statement ins(*db_,
                          "INSERT OR REPLACE INTO kernels (arch, code_version, variant, nvrtc_version, options, is_cubin, "
                          "lowered_names, image, checksum, library_version, created_at) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    ins.bind(1, key.arch);
    ins.bind(2, key.code_version);
    ins.bind(3, key.variant);
    ins.bind(4, k.nvrtc_version);
    ins.bind(5, k.options);
    ins.bind(6, k.is_cubin ? 1 : 0);
    const std::string names = join_lowered_names(k.lowered_names);
    ins.bind(7, names);
    ins.bind(8, static_cast<const void*>(k.image.data()), static_cast<int>(k.image.size()));
    ins.bind(9, kernel_checksum(k.image, names));
    ins.bind(10, std::string(version()));
    ins.bind(11, static_cast<int64_t>(std::time(nullptr)));
    ins.exec();
  });
}

int64_t Store::kernel_count() {
  std::lock_guard lock(mutex_);
  if (!db_ || health_ == Health::Unusable) return 0;
  try {
    return db_->execAndGet("SELECT count(*) FROM kernels").getInt64();
  } catch (const SQLite::Exception&) {
    return 0;
  }
}

std::vector<KernelKey> Store::kernel_keys() {
  std::lock_guard lock(mutex_);
  std::vector<KernelKey> out;
  if (!db_ || health_ == Health::Unusable) return out;
  try {
    SQLite::Statement q(*db_, "SELECT arch, code_version, variant FROM kernels ORDER BY arch, code_version, variant");
    while (q.executeStep()) {
      out.push_back(KernelKey{q.getColumn(0).getInt(), q.getColumn(1).getString(), q.getColumn(2).getString()});
    }
  } catch (const SQLite::Exception& e) {
    failed(e, Access::Listing);
  }
  return out;
}

bool Store::remove_kernel(const KernelKey& key) {
  return run_write("a removal", [&] {
    SQLite::Statement q(*db_, "DELETE FROM kernels WHERE arch = ? AND code_version = ? AND variant = ?");
    q.bind(1, key.arch);
    q.bind(2, key.code_version);
    q.bind(3, key.variant);
    q.exec();
  });
}

Store::Claim Store::claim(const std::string& key, const std::string& owner, double seconds) {
  Claim result = Claim::Unavailable;
  // A NaN would be stored as NULL and fail the NOT NULL constraint, and a failed write leaves the store read-only.
  if (!(seconds >= 0.0 && seconds <= 86400.0)) return result;
  const double now = unix_now();
  run_write("a tuning lease", [&] {
    SQLite::Statement q(*db_, "SELECT owner, expires_at FROM leases WHERE key = ?");
    q.bind(1, key);
    if (q.executeStep() && q.getColumn(0).getString() != owner && q.getColumn(1).getDouble() > now) {
      const std::string holder_text = q.getColumn(0).getString();
      const auto holder = LeaseHolder::parse(holder_text);
      if (!holder || holder->liveness() != LeaseHolder::Liveness::Dead) {
        result = Claim::HeldByOther;
        return;
      }
      detail::logger().info("taking over the tuning lease on {} in {}: its holder ({}) no longer runs", key, path_,
                    holder->describe(now));
    }
    SQLite::Statement ins(*db_, "INSERT OR REPLACE INTO leases (key, owner, expires_at) VALUES (?, ?, ?)");
    ins.bind(1, key);
    ins.bind(2, owner);
    ins.bind(3, now + seconds);
    ins.exec();
    result = Claim::Acquired;
  });
  return result;
}

std::optional<Store::Lease> Store::lease(const std::string& key) {
  std::optional<Lease> result;
  if (!usable()) return result;
  std::lock_guard lock(mutex_);
  try {
    SQLite::Statement q(*db_, "SELECT owner, expires_at FROM leases WHERE key = ?");
    q.bind(1, key);
    if (q.executeStep()) result = Lease{q.getColumn(0).getString(), q.getColumn(1).getDouble()};
  } catch (const std::exception& e) {
    detail::logger().debug("reading the lease on {} in {}: {}", key, path_, e.what());
  }
  return result;
}

int Store::release_process_leases(const LeaseHolder& holder) {
  int released = 0;
  run_write("releasing leases", [&] {
    std::vector<std::string> owners;
    SQLite::Statement q(*db_, "SELECT DISTINCT owner FROM leases");
    while (q.executeStep()) {
      const std::string owner = q.getColumn(0).getString();
      const auto h = LeaseHolder::parse(owner);
      if (h && h->same_process(holder)) owners.push_back(owner);
    }
    for (const auto& owner : owners) {
      SQLite::Statement d(*db_, "DELETE FROM leases WHERE owner = ?");
      d.bind(1, owner);
      released += d.exec();
    }
  });
  return released;
}

void Store::release(const std::string& key, const std::string& owner) {
  run_write("a tuning lease", [&] {
    SQLite::Statement d(*db_, "DELETE FROM leases WHERE key = ? AND owner = ?");
    d.bind(1, key);
    d.bind(2, owner);
    d.exec();
  });
}

LeaseHeartbeat::LeaseHeartbeat(std::string path, std::string key, std::string owner, double period_seconds,
                               double lease_seconds)
    : thread_([this, path = std::move(path), key = std::move(key), owner = std::move(owner), period_seconds,
               lease_seconds](const std::stop_token& stop) {
        std::unique_ptr<Store> store;
        std::mutex m;
        std::condition_variable_any wake;
        const auto period = std::chrono::duration<double>(period_seconds);
        while (!stop.stop_requested()) {
          {
            std::unique_lock lock(m);
            wake.wait_for(lock, stop, period, [] { return false; });  // returns early when stop is requested
          }
          if (stop.stop_requested()) return;
          if (!store) store = std::make_unique<Store>(path, Store::Mode::ReadWrite);
          if (store->writable() && store->claim(key, owner, lease_seconds) == Store::Claim::Acquired) renewals_++;
        }
      }) {}

LeaseHeartbeat::~LeaseHeartbeat() = default;  // std::jthread: request_stop, then join

}  // namespace gnsilu::cache
