// One SQLite cache file: the versioned schema and its migrations (schema.cpp), tuned configurations, compiled
// kernels and tuning leases (store.cpp), opened and checked by store_open.cpp. Nothing here throws: a file that
// cannot be used (corrupt, truncated, made by a newer gnsilu, unwritable, full, locked for too long) is reported
// once through the logger, with what to do, and from then on the store answers "not found" (or refuses writes)
// while the library works from memory. The store never deletes, rewrites or truncates a file it cannot use.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cache/entries.hpp"
#include "cache/lease.hpp"
#include "cache/trust.hpp"

namespace SQLite {
class Database;
class Exception;
}

namespace gnsilu::cache {

// 4: what an entry was tuned on is typed (tuned_dims, tuned_groups, path; schema.cpp).
constexpr int kSchemaVersion = 4;

class Store {
 public:
  enum class Mode { ReadWrite, ReadOnly };
  enum class Claim { Acquired, HeldByOther, Unavailable };

  // Opens (ReadWrite: creating the file and its folder if needed) and migrates. Never throws; check usable().
  Store(std::string path, Mode mode, int busy_timeout_ms = 5000);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& path() const { return path_; }
  bool usable() const;    // can be read
  bool writable() const;  // can be read and written
  std::string problem() const;  // why it is not usable or not writable ("" when fine)
  int schema_version() const;   // of the file as opened (0 for a new file before migration)

  std::optional<TuningEntry> find_tuning(const TuningKey& key);
  // Replaces an entry with the same key. A key whose layout or activation is not one of the enums' values is
  // refused (false; nothing written, the store stays writable): it could never be found again; so is an entry
  // whose tuned shape would not read back as written (a path that is not one of Path's values, a dim below 1).
  bool put_tuning(const TuningEntry& entry);
  std::vector<TuningEntry> all_tuning();
  bool remove_tuning(const TuningKey& key);

  // nullopt also for every kernel of a file that fails the trust check (trust.hpp; one warning names the file
  // and the fix): such kernels are compiled again instead.
  std::optional<KernelImage> find_kernel(const KernelKey& key);
  // The kernel as stored (its checksum checked), whatever the trust check says: for inspecting a file
  // (gnsilu-tune verify --kernels), never for loading.
  std::optional<KernelImage> read_kernel(const KernelKey& key);
  const CodeTrust& code_trust() const { return trust_; }
  bool put_kernel(const KernelKey& key, const KernelImage& image);
  int64_t kernel_count();
  std::vector<KernelKey> kernel_keys();
  bool remove_kernel(const KernelKey& key);

  // A lease on tuning `key` for `seconds` (0 to 86400; anything else: Unavailable), so that one process tunes
  // while the others wait or use the default. The owner may renew it (claim again). Another owner's lease is
  // taken over when it has expired, or at once when its holder (an owner in LeaseHolder's form, lease.hpp) ran
  // on this host and no longer runs; the check and the takeover are one write transaction, so two processes
  // that find the same dead lease do not both acquire it.
  Claim claim(const std::string& key, const std::string& owner, double seconds);
  void release(const std::string& key, const std::string& owner);
  struct Lease {
    std::string owner;
    double expires_at = 0.0;  // Unix time
  };
  std::optional<Lease> lease(const std::string& key);  // the lease on `key` as the file holds it
  // Releases every lease held by `holder`'s process (any of its threads); returns how many.
  int release_process_leases(const LeaseHolder& holder);

  // Applies migration steps [1, up_to] only (tests build files of an older schema with it).
  static bool create_at_version(const std::string& path, int up_to);

  // Like Store(path, Mode::ReadOnly), except that a file of an older schema, which a read-only store cannot use,
  // is read through a copy of it in memory (SQLite's online backup: one consistent snapshot; the file is only
  // read) upgraded there to the current schema: how gnsilu-tune lists, exports and imports old files without
  // changing them. Never throws; check usable().
  static std::unique_ptr<Store> read_upgraded(const std::string& path, int busy_timeout_ms = 5000);

 private:
  Store(std::string path, int busy_timeout_ms, bool upgrade_copy);
  enum class Health { Ok, ReadOnly, Unusable };
  void fail(Health health, const std::string& what, const std::string& advice);
  // What a failed SQLite call means for the store, by what it was doing (store_open.cpp): the one place that
  // reads SQLite's result codes. `what` names what a write was saving.
  enum class Access { Opening, Writing, Finding, Listing, LoadingKernel };
  void failed(const SQLite::Exception& e, Access access, const char* what = "");
  void open(int busy_timeout_ms);
  bool run_write(const char* what, const std::function<void()>& body);

  std::string path_;
  Mode mode_;
  mutable std::mutex mutex_;
  std::unique_ptr<SQLite::Database> db_;
  Health health_ = Health::Ok;
  std::string problem_;
  int schema_version_ = 0;
  bool warned_ = false;
  CodeTrust trust_;             // whether this file's kernels may be loaded (trust.hpp)
  std::optional<KernelImage> read_kernel_locked(const KernelKey& key);
  bool trust_warned_ = false;
  bool upgrade_copy_ = false;  // read_upgraded: an older schema is read through an upgraded copy in memory
};

// Renews a lease (claims it again for kLeaseSeconds) every kLeaseHeartbeatSeconds until destroyed, on a thread
// of its own with its own connection to the file: a holder stays known to be alive while it tunes.
class LeaseHeartbeat {
 public:
  LeaseHeartbeat(std::string path, std::string key, std::string owner,
                 double period_seconds = kLeaseHeartbeatSeconds, double lease_seconds = kLeaseSeconds);
  ~LeaseHeartbeat();  // stops and joins the thread
  LeaseHeartbeat(const LeaseHeartbeat&) = delete;
  LeaseHeartbeat& operator=(const LeaseHeartbeat&) = delete;
  int renewals() const { return renewals_.load(); }

 private:
  std::atomic<int> renewals_{0};
  std::jthread thread_;
};

}  // namespace gnsilu::cache
