// The cache file's schema and its migrations (schema.hpp).
#include "cache/schema.hpp"

#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache/entries.hpp"
#include "cache/store.hpp"

namespace gnsilu::cache {
namespace {

struct Step {
  const char* sql;
  void (*fill)(SQLite::Database&) = nullptr;  // run after the SQL: what SQL alone cannot compute
};

// Step 4's fill: the typed columns of every row of before, from its tuned_shape text and size class, read once
// here (tuned_shape_from_legacy) so that nothing else reads them.
void fill_typed_shapes(SQLite::Database& db) {
  struct Row {
    int64_t id;
    TunedShape shape;
  };
  std::vector<Row> rows;
  {
    SQLite::Statement q(db, "SELECT id, tuned_shape, size_class FROM tuning ORDER BY id");
    while (q.executeStep()) {
      rows.push_back({q.getColumn(0).getInt64(),
                      tuned_shape_from_legacy(q.getColumn(1).getString(), q.getColumn(2).getString())});
    }
  }
  SQLite::Statement set(db, "UPDATE tuning SET tuned_dims = ?, tuned_groups = ?, path = ? WHERE id = ?");
  for (const auto& r : rows) {
    set.bind(1, shape_to_text(r.shape.dims));
    set.bind(2, static_cast<int64_t>(r.shape.groups));
    set.bind(3, std::string(path_name(r.shape.path)));
    set.bind(4, r.id);
    set.exec();
    set.reset();
  }
}

// Migration steps: step k takes a file from schema k-1 to k. A file records its schema in PRAGMA user_version.
const Step kSteps[] = {
    // 1: tuned configurations and every candidate's timing.
    {R"sql(
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
    )sql", nullptr},
    // 2: compiled kernels (so that a second process runs no NVRTC) and tuning leases (one tuner per key).
    {R"sql(
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
    )sql", nullptr},
    // 3: the memory layout ('nchw', 'nhwc') and the activation ('silu', 'none') join the tuning key; entries of
    // before were all channels-first GroupNorm+SiLU. SQLite cannot change a UNIQUE constraint in place, so the
    // table is rebuilt: same row ids (timings.tuning_id keeps pointing at its row), the new UNIQUE key. The
    // defaults are for a process of schema 2 that had the file open before another migrated it: what it saves
    // is what it tuned, channels-first GroupNorm+SiLU (this gnsilu always names both).
    {R"sql(
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
    )sql", nullptr},
    // 4: what an entry was tuned on, typed: tuned_dims in shape_to_text's form ('' when not known), tuned_groups
    // (0 when not known) and the path ('fused', 'split'; 'auto' for an entry that did not record it). Rows of
    // before get them from their tuned_shape text and size class, parsed once (fill_typed_shapes). tuned_shape
    // stays, written with the display text, for a process of schema 3 or before that had the file open before it
    // was migrated: what such a process saves afterwards has path '' (the default), and is read through its text
    // like a migrated row (read_entry). The key (UNIQUE) does not change: the size class already names the path.
    {R"sql(
      ALTER TABLE tuning ADD COLUMN tuned_dims TEXT NOT NULL DEFAULT '';
      ALTER TABLE tuning ADD COLUMN tuned_groups INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE tuning ADD COLUMN path TEXT NOT NULL DEFAULT '';
    )sql", fill_typed_shapes},
};
static_assert(sizeof(kSteps) / sizeof(kSteps[0]) == kSchemaVersion, "one migration step per schema version");

}  // namespace

void apply_steps(SQLite::Database& db, int from, int to) {
  if (from < 0) throw SQLite::Exception("negative schema version " + std::to_string(from), SQLITE_MISMATCH);
  if (to > kSchemaVersion) throw SQLite::Exception("no schema " + std::to_string(to), SQLITE_MISMATCH);
  for (int step = from + 1; step <= to; ++step) {
    db.exec(kSteps[step - 1].sql);
    if (kSteps[step - 1].fill) kSteps[step - 1].fill(db);
  }
  db.exec("PRAGMA user_version = " + std::to_string(to));
  db.exec("INSERT OR REPLACE INTO meta (name, value) VALUES ('schema', '" + std::to_string(to) + "')");
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

}  // namespace gnsilu::cache
