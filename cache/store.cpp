#include "cache/store.hpp"

#include <SQLiteCpp/Backup.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <chrono>
#include <condition_variable>
#include <stop_token>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "base/log.hpp"

namespace gnsilu::cache {
namespace {

// Migration steps: step k takes a file from schema k-1 to k. A file records its schema in PRAGMA user_version.
const char* const kSteps[] = {
    // 1: tuned configurations and every candidate's timing.
    R"sql(
      CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
      CREATE TABLE tuning (
        id INTEGER PRIMARY KEY,
        device_name TEXT NOT NULL,
        device_arch INTEGER NOT NULL,
        device_sms INTEGER NOT NULL,
        device_memory_mib INTEGER NOT NULL,
        device_l2_kib INTEGER NOT NULL,
        code_version TEXT NOT NULL,
        channels_per_group INTEGER NOT NULL,
        x_dtype TEXT NOT NULL,
        y_dtype TEXT NOT NULL,
        size_class TEXT NOT NULL,
        elems_per_load INTEGER NOT NULL,
        warps INTEGER NOT NULL,
        stages INTEGER NOT NULL,
        programs_per_sm INTEGER NOT NULL,
        default_us REAL NOT NULL,
        best_us REAL NOT NULL,
        noise_us REAL NOT NULL,
        tuned_shape TEXT NOT NULL,
        library_version TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        UNIQUE (device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version,
                channels_per_group, x_dtype, y_dtype, size_class));
      CREATE TABLE timings (
        tuning_id INTEGER NOT NULL,
        elems_per_load INTEGER NOT NULL,
        warps INTEGER NOT NULL,
        stages INTEGER NOT NULL,
        programs_per_sm INTEGER NOT NULL,
        median_us REAL NOT NULL,
        noise_us REAL NOT NULL,
        samples INTEGER NOT NULL,
        status TEXT NOT NULL);
      CREATE INDEX timings_by_tuning ON timings (tuning_id);
    )sql",
    // 2: compiled kernels (so that a second process runs no NVRTC) and tuning leases (one tuner per key).
    R"sql(
      CREATE TABLE kernels (
        arch INTEGER NOT NULL,
        code_version TEXT NOT NULL,
        variant TEXT NOT NULL,
        nvrtc_version TEXT NOT NULL,
        options TEXT NOT NULL,
        is_cubin INTEGER NOT NULL,
        lowered_names TEXT NOT NULL,
        image BLOB NOT NULL,
        checksum TEXT NOT NULL,
        library_version TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (arch, code_version, variant));
      CREATE TABLE leases (key TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL);
    )sql",
    // 3: the memory layout ('nchw', 'nhwc') and the activation ('silu', 'none') join the tuning key; entries of
    // before were all channels-first GroupNorm+SiLU. SQLite cannot change a UNIQUE constraint in place, so the
    // table is rebuilt: same row ids (timings.tuning_id keeps pointing at its row), the new UNIQUE key. The
    // defaults are for a process of schema 2 that had the file open before another migrated it: what it saves
    // is what it tuned, channels-first GroupNorm+SiLU (this gnsilu always names both).
    R"sql(
      CREATE TABLE tuning_v3 (
        id INTEGER PRIMARY KEY,
        device_name TEXT NOT NULL,
        device_arch INTEGER NOT NULL,
        device_sms INTEGER NOT NULL,
        device_memory_mib INTEGER NOT NULL,
        device_l2_kib INTEGER NOT NULL,
        code_version TEXT NOT NULL,
        channels_per_group INTEGER NOT NULL,
        x_dtype TEXT NOT NULL,
        y_dtype TEXT NOT NULL,
        size_class TEXT NOT NULL,
        layout TEXT NOT NULL DEFAULT 'nchw',
        activation TEXT NOT NULL DEFAULT 'silu',
        elems_per_load INTEGER NOT NULL,
        warps INTEGER NOT NULL,
        stages INTEGER NOT NULL,
        programs_per_sm INTEGER NOT NULL,
        default_us REAL NOT NULL,
        best_us REAL NOT NULL,
        noise_us REAL NOT NULL,
        tuned_shape TEXT NOT NULL,
        library_version TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        UNIQUE (device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version,
                channels_per_group, x_dtype, y_dtype, size_class, layout, activation));
      INSERT INTO tuning_v3 (id, device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version,
                             channels_per_group, x_dtype, y_dtype, size_class, layout, activation, elems_per_load,
                             warps, stages, programs_per_sm, default_us, best_us, noise_us, tuned_shape,
                             library_version, created_at)
        SELECT id, device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version,
               channels_per_group, x_dtype, y_dtype, size_class, 'nchw', 'silu', elems_per_load, warps, stages,
               programs_per_sm, default_us, best_us, noise_us, tuned_shape, library_version, created_at
        FROM tuning;
      DROP TABLE tuning;
      ALTER TABLE tuning_v3 RENAME TO tuning;
    )sql",
};
static_assert(sizeof(kSteps) / sizeof(kSteps[0]) == kSchemaVersion, "one migration step per schema version");

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

// Whether a key's layout and activation are values this gnsilu names (a key built from anything else would be
// stored as "unknown" and never read back).
bool known_key(const TuningKey& k) {
  Layout layout;
  Activation activation;
  return layout_from_name(layout_name(k.layout), layout) && activation_from_name(activation_name(k.activation), activation);
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    if (!out.empty()) out += '\n';
    out += n;
  }
  return out;
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

int primary(const SQLite::Exception& e) { return e.getErrorCode() & 0xFF; }


// file:<path>?mode=ro (with &immutable=1 when asked) with the characters URIs reserve percent-encoded.
std::string read_only_uri(const std::string& path, bool immutable) {
  std::string out = "file:";
  for (unsigned char c : path) {
    if (c == '%' || c == '?' || c == '#' || c < 0x20) {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + (immutable ? "?mode=ro&immutable=1" : "?mode=ro");
}

void apply_steps(SQLite::Database& db, int from, int to) {
  if (from < 0) throw SQLite::Exception("negative schema version " + std::to_string(from), SQLITE_MISMATCH);
  for (int step = from + 1; step <= to; ++step) db.exec(kSteps[step - 1]);
  db.exec("PRAGMA user_version = " + std::to_string(to));
  db.exec("INSERT OR REPLACE INTO meta (name, value) VALUES ('schema', '" + std::to_string(to) + "')");
}

// An entry from a row of kEntryColumns; false (and `e` partly filled) for a row whose layout or activation this
// gnsilu does not know: no key of this gnsilu can name it, so it is not an entry here.
bool read_entry(SQLite::Statement& q, TuningEntry& e) {
  e.key.device.name = q.getColumn(1).getString();
  e.key.device.arch = q.getColumn(2).getInt();
  e.key.device.sms = q.getColumn(3).getInt();
  e.key.device.memory_mib = q.getColumn(4).getInt64();
  e.key.device.l2_kib = q.getColumn(5).getInt();
  e.key.code_version = q.getColumn(6).getString();
  e.key.channels_per_group = q.getColumn(7).getInt64();
  e.key.x_dtype = dtype_from_name(q.getColumn(8).getString());
  e.key.y_dtype = dtype_from_name(q.getColumn(9).getString());
  e.key.size_class = q.getColumn(10).getString();
  e.winner = {q.getColumn(11).getInt(), q.getColumn(12).getInt(), q.getColumn(13).getInt(), q.getColumn(14).getInt()};
  e.default_us = q.getColumn(15).getDouble();
  e.best_us = q.getColumn(16).getDouble();
  e.noise_us = q.getColumn(17).getDouble();
  e.tuned_shape = q.getColumn(18).getString();
  e.library_version = q.getColumn(19).getString();
  e.created_at = q.getColumn(20).getInt64();
  return layout_from_name(q.getColumn(21).getString(), e.key.layout) &&
         activation_from_name(q.getColumn(22).getString(), e.key.activation);
}

const char* kEntryColumns =
    "id, device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version, channels_per_group, "
    "x_dtype, y_dtype, size_class, elems_per_load, warps, stages, programs_per_sm, default_us, best_us, noise_us, "
    "tuned_shape, library_version, created_at, layout, activation";

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

Store::Store(std::string path, Mode mode, int busy_timeout_ms) : path_(std::move(path)), mode_(mode) {
  open(busy_timeout_ms);
}

Store::Store(std::string path, int busy_timeout_ms, bool upgrade_copy)
    : path_(std::move(path)), mode_(Mode::ReadOnly), upgrade_copy_(upgrade_copy) {
  open(busy_timeout_ms);
}

std::unique_ptr<Store> Store::read_upgraded(const std::string& path, int busy_timeout_ms) {
  return std::unique_ptr<Store>(new Store(path, busy_timeout_ms, true));
}

Store::~Store() = default;

bool Store::usable() const {
  std::lock_guard lock(mutex_);
  return db_ && health_ != Health::Unusable;
}

bool Store::writable() const {
  std::lock_guard lock(mutex_);
  return db_ && health_ == Health::Ok && mode_ == Mode::ReadWrite;
}

std::string Store::problem() const {
  std::lock_guard lock(mutex_);
  return problem_;
}

int Store::schema_version() const {
  std::lock_guard lock(mutex_);
  return schema_version_;
}

void Store::fail(Health health, const std::string& what, const std::string& advice) {
  if (health > health_) health_ = health;
  if (problem_.empty()) problem_ = what;
  if (!warned_) {
    warned_ = true;
    detail::logger().warn("cache file {}: {}; {}. {}", path_, what,
                          health_ == Health::Unusable ? "gnsilu does not use it and works from memory"
                                                      : "gnsilu reads it but keeps new results in memory only",
                          advice);
  }
}

void Store::open(int busy_timeout_ms) {
  try {
    if (mode_ == Mode::ReadWrite) {
      std::error_code ec;
      const auto parent = std::filesystem::path(path_).parent_path();
      if (!parent.empty() && !std::filesystem::exists(parent, ec)) {
        // A new cache folder is the user's alone (0700), whatever the umask; an existing one is left as it is.
        if (std::filesystem::create_directories(parent, ec)) ::chmod(parent.c_str(), 0700);
      }
      if (!std::filesystem::exists(path_, ec)) {
        // A new file 0600 whatever the umask (SQLite gives its -wal and -shm files the same mode).
        const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
          ::fchmod(fd, 0600);
          ::close(fd);
        }
      }
      try {
        db_ = std::make_unique<SQLite::Database>(path_, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE, busy_timeout_ms);
      } catch (const SQLite::Exception& e) {
        // Not writable (read-only file, folder or file system): read what is there, if anything.
        db_ = std::make_unique<SQLite::Database>(path_, SQLite::OPEN_READONLY, busy_timeout_ms);
        fail(Health::ReadOnly, std::string("cannot be opened for writing (") + e.what() + ")",
             "Make it writable, or point GNSILU_CACHE at a writable file.");
      }
    } else {
      // Read-only, with the usual locking so that a file another process still writes (in WAL mode) reads
      // right; where that cannot work (a read-only mount with no -shm file), as an immutable file.
      db_ = std::make_unique<SQLite::Database>(read_only_uri(path_, false), SQLite::OPEN_READONLY | SQLite::OPEN_URI,
                                               busy_timeout_ms);
      try {
        db_->execAndGet("SELECT count(*) FROM sqlite_master");
      } catch (const SQLite::Exception& e) {
        const int code = primary(e);
        if (code == SQLITE_NOTADB || code == SQLITE_CORRUPT) throw;
        db_ = std::make_unique<SQLite::Database>(read_only_uri(path_, true), SQLite::OPEN_READONLY | SQLite::OPEN_URI,
                                                 busy_timeout_ms);
      }
    }
  } catch (const SQLite::Exception& e) {
    db_.reset();
    fail(Health::Unusable, std::string("cannot be opened (") + e.what() + ")",
         mode_ == Mode::ReadWrite ? "Check the path, or set GNSILU_CACHE to another file."
                                  : "Check the path in GNSILU_CACHE_SHARED.");
    return;
  }
  trust_ = cache::code_trust(path_);
  try {
    // One statement, so that the version and the tables come from one snapshot while another process may be
    // creating the file.
    int objects = 0;
    {
      SQLite::Statement state(*db_, "SELECT (SELECT user_version FROM pragma_user_version), "
                                    "(SELECT count(*) FROM sqlite_master)");
      state.executeStep();
      schema_version_ = state.getColumn(0).getInt();
      objects = state.getColumn(1).getInt();
    }
    if ((schema_version_ == 0 && objects > 0) || schema_version_ < 0) {
      fail(Health::Unusable, "is a SQLite database but not a gnsilu cache", "Set GNSILU_CACHE to another file.");
      return;
    }
    if (schema_version_ > kSchemaVersion) {
      fail(Health::Unusable,
           "was written by a newer gnsilu (schema " + std::to_string(schema_version_) + ", this one knows up to " +
               std::to_string(kSchemaVersion) + ")",
           "Give this version its own file with GNSILU_CACHE, or upgrade.");
      return;
    }
    const bool copy = upgrade_copy_ && schema_version_ < kSchemaVersion;
    if (copy) {
      // Every page in one step: one snapshot of the file, never a mix of two writers' states.
      auto memory = std::make_unique<SQLite::Database>(":memory:", SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
      {
        SQLite::Backup backup(*memory, *db_);
        const int done = backup.executeStep();
        if (done != SQLITE_DONE) throw SQLite::Exception("copying the file did not finish", done);
      }  // finished before the file's connection closes
      db_ = std::move(memory);
    }
    // A damaged page anywhere: refuse the file rather than write into it, or migrate its copy (a few
    // milliseconds for a typical cache; the user file is checked once per process).
    if (objects > 0 && (mode_ == Mode::ReadWrite || copy)) {
      const std::string check = db_->execAndGet("PRAGMA quick_check").getString();
      if (check != "ok") {
        fail(Health::Unusable, "is damaged (" + check.substr(0, check.find('\n')) + ")",
             "Delete it (gnsilu starts a new one) or set GNSILU_CACHE to another file.");
        return;
      }
    }
    if (copy) {
      // The copy is this store's own: upgraded in memory, then read like the file (mode_ is ReadOnly).
      SQLite::Transaction t(*db_);
      apply_steps(*db_, schema_version_, kSchemaVersion);
      t.commit();
      schema_version_ = kSchemaVersion;
      return;
    }
    if (mode_ == Mode::ReadOnly || health_ == Health::ReadOnly) {
      if (schema_version_ < kSchemaVersion) {
        fail(Health::Unusable,
             "has an older schema (" + std::to_string(schema_version_) + ") and cannot be upgraded read-only",
             "Open it once with a writable GNSILU_CACHE to upgrade it, or re-export it.");
      }
      return;
    }
    db_->exec("PRAGMA synchronous = NORMAL");
    if (schema_version_ < kSchemaVersion) {
      SQLite::Transaction t(*db_, SQLite::TransactionBehavior::IMMEDIATE);
      // Another process may have migrated while this one waited for the lock.
      const int now = db_->execAndGet("PRAGMA user_version").getInt();
      if (now < kSchemaVersion) apply_steps(*db_, now, kSchemaVersion);
      t.commit();
      if (now < kSchemaVersion && now > 0) {
        detail::logger().info("cache file {}: upgraded schema {} to {}", path_, now, kSchemaVersion);
      }
      schema_version_ = kSchemaVersion;
    }
    // WAL only once the file is known to be a usable cache: a file found damaged by the migration above (which
    // then rolls back) is left exactly as it was.
    try {
      db_->exec("PRAGMA journal_mode = WAL");
    } catch (const SQLite::Exception&) {
      // Some file systems cannot hold a WAL; the rollback journal works there.
    }
  } catch (const SQLite::Exception& e) {
    const int code = primary(e);
    if (code == SQLITE_NOTADB || code == SQLITE_CORRUPT) {
      fail(Health::Unusable, std::string("is damaged or not a database (") + e.what() + ")",
           "Delete it (gnsilu starts a new one) or set GNSILU_CACHE to another file.");
    } else if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
      fail(Health::Unusable, std::string("stayed locked by another process (") + e.what() + ")",
           "Retry later; this process works from memory.");
    } else {
      fail(Health::Unusable, std::string("cannot be read or upgraded (") + e.what() + ")",
           "Check the file, or set GNSILU_CACHE to another one.");
    }
  }
}

bool Store::create_at_version(const std::string& path, int up_to) {
  try {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    SQLite::Transaction t(db);
    apply_steps(db, 0, up_to);
    t.commit();
    return true;
  } catch (const SQLite::Exception&) {
    return false;
  }
}

bool Store::run_write(const char* what, const std::function<void()>& body) {
  std::lock_guard lock(mutex_);
  if (!db_ || health_ != Health::Ok || mode_ != Mode::ReadWrite) return false;
  try {
    SQLite::Transaction t(*db_, SQLite::TransactionBehavior::IMMEDIATE);
    body();
    t.commit();
    // Move committed pages from the WAL into the file now, so that readers that cannot use the WAL (a copy of
    // the file, an immutable read-only layer) see them even if this process never closes the connection.
    try {
      db_->exec("PRAGMA wal_checkpoint(PASSIVE)");
    } catch (const SQLite::Exception&) {
    }
    return true;
  } catch (const SQLite::Exception& e) {
    const int code = primary(e);
    if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
      // Transient: this result stays in memory; later writes may succeed.
      if (!warned_) {
        warned_ = true;
        detail::logger().warn("cache file {}: locked by another process while saving {}; kept in memory. "
                              "If this persists, look for a process holding the file.", path_, what);
      }
    } else if (code == SQLITE_FULL) {
      fail(Health::ReadOnly, std::string("is on a full disk (") + e.what() + ")", "Free space on its file system.");
    } else if (code == SQLITE_READONLY || code == SQLITE_PERM || code == SQLITE_CANTOPEN) {
      fail(Health::ReadOnly, std::string("cannot be written (") + e.what() + ")",
           "Make it writable, or point GNSILU_CACHE at a writable file.");
    } else if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB) {
      fail(Health::Unusable, std::string("is damaged (") + e.what() + ")",
           "Delete it (gnsilu starts a new one) or set GNSILU_CACHE to another file.");
    } else {
      fail(Health::ReadOnly, std::string("failed while saving ") + what + " (" + e.what() + ")",
           "Check the file and its file system.");
    }
    return false;
  }
}

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
    const int code = primary(e);
    if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB) {
      fail(Health::Unusable, std::string("is damaged (") + e.what() + ")",
           "Delete it (gnsilu starts a new one) or set GNSILU_CACHE to another file.");
    } else if (code != SQLITE_BUSY && code != SQLITE_LOCKED) {
      fail(Health::Unusable, std::string("cannot be read (") + e.what() + ")", "Check the file.");
    }
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
    fail(Health::Unusable, std::string("cannot be read (") + e.what() + ")", "Check the file.");
  }
  return out;
}

bool Store::put_tuning(const TuningEntry& entry) {
  // Refused before any write (the store stays as it was): it could never be found again.
  if (!known_key(entry.key)) return false;
  return run_write("a tuned configuration", [&] {
    delete_entry(*db_, entry.key);
    SQLite::Statement ins(*db_,
                          "INSERT INTO tuning (device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, "
                          "code_version, channels_per_group, x_dtype, y_dtype, size_class, layout, activation, "
                          "elems_per_load, warps, stages, programs_per_sm, default_us, best_us, noise_us, tuned_shape, "
                          "library_version, created_at) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    bind_key(ins, entry.key);
    constexpr int v = kKeyColumns + 1;  // the first value after the key
    ins.bind(v + 0, entry.winner.elems_per_load);
    ins.bind(v + 1, entry.winner.warps);
    ins.bind(v + 2, entry.winner.stages);
    ins.bind(v + 3, entry.winner.programs_per_sm);
    ins.bind(v + 4, entry.default_us);
    ins.bind(v + 5, entry.best_us);
    ins.bind(v + 6, entry.noise_us);
    ins.bind(v + 7, entry.tuned_shape);
    ins.bind(v + 8, entry.library_version);
    ins.bind(v + 9, static_cast<int64_t>(entry.created_at));
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
    k.lowered_names = split_names(names);
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
    const int code = primary(e);
    if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB) {
      fail(Health::Unusable, std::string("is damaged (") + e.what() + ")",
           "Delete it (gnsilu starts a new one) or set GNSILU_CACHE to another file.");
    }
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
    const std::string names = join_names(k.lowered_names);
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
    fail(Health::Unusable, std::string("cannot be read (") + e.what() + ")", "Check the file.");
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
               lease_seconds](std::stop_token stop) {
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
