// Opening a cache file (creating, checking and migrating it), its health, the one triage of SQLite failures
// and the write transaction (store.hpp). The schema and its migrations are in schema.cpp; rows, kernels and
// leases in store.cpp.
#include <SQLiteCpp/Backup.h>
#include <SQLiteCpp/SQLiteCpp.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "base/log.hpp"
#include "cache/schema.hpp"
#include "cache/store.hpp"

namespace gnsilu::cache {
namespace {

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

// The one triage of a failed SQLite call: what it means for this store depends on what the store was doing.
// Damaged (CORRUPT, NOTADB) and locked (BUSY, LOCKED, which the busy timeout already waited out) are told apart
// everywhere; a lookup that finds the file locked reports nothing (the caller works from memory this time), a
// write that does warns once and keeps the result in memory (later writes may succeed).
void Store::failed(const SQLite::Exception& e, Access access, const char* what) {
  const int code = primary(e);
  const bool damaged = code == SQLITE_CORRUPT || code == SQLITE_NOTADB;
  const bool locked = code == SQLITE_BUSY || code == SQLITE_LOCKED;
  const std::string why = std::string(" (") + e.what() + ")";
  constexpr const char* kDamagedAdvice = "Delete it (gnsilu starts a new one) or set GNSILU_CACHE to another file.";
  switch (access) {
    case Access::Opening:
      if (damaged) {
        fail(Health::Unusable, "is damaged or not a database" + why, kDamagedAdvice);
      } else if (locked) {
        fail(Health::Unusable, "stayed locked by another process" + why, "Retry later; this process works from memory.");
      } else {
        fail(Health::Unusable, "cannot be read or upgraded" + why, "Check the file, or set GNSILU_CACHE to another one.");
      }
      return;
    case Access::Writing:
      if (locked) {
        if (!warned_) {
          warned_ = true;
          detail::logger().warn("cache file {}: locked by another process while saving {}; kept in memory. "
                                "If this persists, look for a process holding the file.", path_, what);
        }
      } else if (code == SQLITE_FULL) {
        fail(Health::ReadOnly, "is on a full disk" + why, "Free space on its file system.");
      } else if (code == SQLITE_READONLY || code == SQLITE_PERM || code == SQLITE_CANTOPEN) {
        fail(Health::ReadOnly, "cannot be written" + why, "Make it writable, or point GNSILU_CACHE at a writable file.");
      } else if (damaged) {
        fail(Health::Unusable, "is damaged" + why, kDamagedAdvice);
      } else {
        fail(Health::ReadOnly, std::string("failed while saving ") + what + why, "Check the file and its file system.");
      }
      return;
    case Access::Finding:
      if (damaged) {
        fail(Health::Unusable, "is damaged" + why, kDamagedAdvice);
      } else if (!locked) {
        fail(Health::Unusable, "cannot be read" + why, "Check the file.");
      }
      return;
    case Access::Listing:
      fail(Health::Unusable, "cannot be read" + why, "Check the file.");
      return;
    case Access::LoadingKernel:
      if (damaged) fail(Health::Unusable, "is damaged" + why, kDamagedAdvice);
      return;
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
    failed(e, Access::Opening);
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
    failed(e, Access::Writing, what);
    return false;
  }
}

}  // namespace gnsilu::cache
