// The cache file's schema: its migration steps, each taking a file one version up (kSchemaVersion, store.hpp, is
// the last). Private to the cache layer: Store opens, migrates and creates files through it.
#pragma once

namespace SQLite {
class Database;
}

namespace gnsilu::cache {

// Takes `db` from schema `from` to `to` (inside the caller's transaction) and records `to` in PRAGMA user_version
// and in meta. Throws SQLite::Exception.
void apply_steps(SQLite::Database& db, int from, int to);

}  // namespace gnsilu::cache
