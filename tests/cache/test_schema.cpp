// The cache schema: a new file gets the current one, older ones are migrated with their rows kept (2 -> 3 -> 4;
// layout and activation became key columns), newer ones are left alone, an older read-only file is read through a
// copy.
#include "cache/cache_support.hpp"

TEST_CASE("an older schema is migrated with its rows kept; a newer one is left alone") {
  TempDir dir("cache-test");
  const std::string old_path = dir.file("v1.sqlite");
  REQUIRE(Store::create_at_version(old_path, 1));
  {
    SQLite::Database db(old_path, SQLite::OPEN_READWRITE);
    CHECK(db.execAndGet("PRAGMA user_version").getInt() == 1);
    CHECK_FALSE(db.tableExists("kernels"));
    db.exec("INSERT INTO tuning (device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version, "
            "channels_per_group, x_dtype, y_dtype, size_class, elems_per_load, warps, stages, programs_per_sm, "
            "default_us, best_us, noise_us, tuned_shape, library_version, created_at) VALUES ('NVIDIA H200', 90, 132, "
            "143771, 61440, 'abc123-0011223344556677', 4, 'bf16', 'bf16', 'dram-split', 32, 8, 2, 2, 10, 9, 0.1, 's', '0.0.9', 1)");
  }
  {
    Store s(old_path, Store::Mode::ReadWrite);
    CHECK(s.writable());
    CHECK(s.schema_version() == kSchemaVersion);
    const auto e = s.find_tuning(key());
    REQUIRE(e.has_value());
    CHECK(e->winner == gnsilu::LaunchConfig{32, 8, 2, 2});
    CHECK(e->library_version == "0.0.9");
    CHECK(e->key.layout == gnsilu::Layout::ChannelsFirst);
    CHECK(e->key.activation == gnsilu::Activation::SiLU);
    CHECK(s.put_kernel({90, "v", "x"}, {true, {'a'}, {"n"}, "", ""}));
  }
  // A read-only layer of an older schema cannot be upgraded: skipped, untouched.
  const std::string old_ro = dir.file("v1-ro.sqlite");
  REQUIRE(Store::create_at_version(old_ro, 1));
  const std::string before_ro = read_bytes(old_ro);
  {
    Store s(old_ro, Store::Mode::ReadOnly);
    CHECK_FALSE(s.usable());
    CHECK(s.problem().find("older schema") != std::string::npos);
  }
  CHECK(read_bytes(old_ro) == before_ro);

  const std::string newer = dir.file("v99.sqlite");
  {
    SQLite::Database db(newer, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("CREATE TABLE tuning (x INTEGER); PRAGMA user_version = 99");
  }
  const std::string before = read_bytes(newer);
  {
    Store s(newer, Store::Mode::ReadWrite);
    CHECK_FALSE(s.usable());
    CHECK(s.problem().find("newer gnsilu") != std::string::npos);
    CHECK_FALSE(s.find_tuning(key()).has_value());
    CHECK_FALSE(s.put_tuning(entry(key())));
  }
  CHECK(read_bytes(newer) == before);
}

namespace {

// A schema-2 file (before layouts and activations) holding two entries with their timings and a kernel, written
// the way gnsilu of that schema wrote them; returns the row ids of the entries.
std::vector<int64_t> schema_2_file(const std::string& path) {
  REQUIRE(Store::create_at_version(path, 2));
  SQLite::Database db(path, SQLite::OPEN_READWRITE);
  REQUIRE(db.execAndGet("PRAGMA user_version").getInt() == 2);
  std::vector<int64_t> ids;
  for (int cpg : {4, 16}) {
    // Row ids far from 1 and 2, so that a rebuild that renumbered rows would be seen.
    db.exec("INSERT INTO tuning (id, device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version, "
            "channels_per_group, x_dtype, y_dtype, size_class, elems_per_load, warps, stages, programs_per_sm, "
            "default_us, best_us, noise_us, tuned_shape, library_version, created_at) VALUES (" +
            std::to_string(100 + 7 * cpg) + ", 'NVIDIA H200', 90, 132, 143771, 61440, 'abc123-0011223344556677', " +
            std::to_string(cpg) + ", 'bf16', 'bf16', 'dram-split', 8, 4, 2, 8, 300.5, 250.25, 2.5, " +
            "'1x128x1024x1024 G=32', '0.1.0', 1764430000)");
    ids.push_back(db.getLastInsertRowid());
    for (int c = 0; c < 3; ++c) {
      db.exec("INSERT INTO timings (tuning_id, elems_per_load, warps, stages, programs_per_sm, median_us, noise_us, "
              "samples, status) VALUES (" + std::to_string(ids.back()) + ", 16, " + std::to_string(4 << c) +
              ", 1, 4, " + std::to_string(260 + c) + ", 1.5, 9, '" + (c == 2 ? "wrong output" : "ok") + "')");
    }
  }
  KernelImage image{true, std::vector<char>(300, 'k'), {"a", "b", "c", "d"}, "--fmad=false", "13.0"};
  const std::string names = "a\nb\nc\nd";
  SQLite::Statement k(db, "INSERT INTO kernels (arch, code_version, variant, nvrtc_version, options, is_cubin, "
                          "lowered_names, image, checksum, library_version, created_at) "
                          "VALUES (90, 'v', 'bf16-bf16-e16-w8-s1', '13.0', '', 1, ?, ?, ?, '0.1.0', 1)");
  k.bind(1, names);
  k.bind(2, static_cast<const void*>(image.image.data()), static_cast<int>(image.image.size()));
  k.bind(3, kernel_checksum(image.image, names));
  k.exec();
  db.exec("PRAGMA journal_mode = DELETE");
  return ids;
}

}  // namespace

TEST_CASE("schema 2 migrates to 3: rows keep their ids, timings and values, and become nchw / silu") {
  TempDir dir("cache-test");
  const std::string path = dir.file("v2.sqlite");
  const std::vector<int64_t> ids = schema_2_file(path);
  {
    Store s(path, Store::Mode::ReadWrite);
    REQUIRE(s.writable());
    CHECK(s.schema_version() == kSchemaVersion);
    const auto all = s.all_tuning();
    REQUIRE(all.size() == 2);
    for (const auto& e : all) {
      CHECK(e.key.layout == gnsilu::Layout::ChannelsFirst);
      CHECK(e.key.activation == gnsilu::Activation::SiLU);
      CHECK(e.winner == gnsilu::LaunchConfig{8, 4, 2, 8});
      CHECK(e.best_us == 250.25);
      CHECK(e.tuned_shape.text() == "1x128x1024x1024 G=32");
      REQUIRE(e.candidates.size() == 3);  // the timings still point at their rows
      CHECK(e.candidates[1].config.warps == 8);
      CHECK(e.candidates[2].status == "wrong output");
    }
    const auto found = s.find_tuning(key(16));
    REQUIRE(found.has_value());
    CHECK(found->key == key(16));
    CHECK(found->candidates.size() == 3);
    CHECK(s.find_kernel({90, "v", "bf16-bf16-e16-w8-s1"}).has_value());
  }
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  CHECK(db.execAndGet("PRAGMA user_version").getInt() == kSchemaVersion);
  CHECK(db.execAndGet("SELECT value FROM meta WHERE name = 'schema'").getString() == std::to_string(kSchemaVersion));
  CHECK(db.execAndGet("PRAGMA integrity_check").getString() == "ok");
  CHECK_FALSE(db.tableExists("tuning_v3"));
  // Same row ids; the index of the timings is still there; the UNIQUE key holds the new columns.
  SQLite::Statement rows(db, "SELECT id, layout, activation FROM tuning ORDER BY id");
  std::vector<int64_t> after;
  while (rows.executeStep()) {
    after.push_back(rows.getColumn(0).getInt64());
    CHECK(rows.getColumn(1).getString() == "nchw");
    CHECK(rows.getColumn(2).getString() == "silu");
  }
  CHECK(after == ids);
  CHECK(db.execAndGet("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'timings_by_tuning'").getInt() == 1);
  CHECK(db.execAndGet("SELECT count(*) FROM timings WHERE tuning_id NOT IN (SELECT id FROM tuning)").getInt() == 0);
  const std::string unique_key = db.execAndGet("SELECT sql FROM sqlite_master WHERE name = 'tuning'").getString();
  CHECK(unique_key.find("size_class, layout, activation)") != std::string::npos);
  // A process of schema 2 that had the file open before the migration still saves what it tuned, as nchw / silu.
  {
    SQLite::Database old_process(path, SQLite::OPEN_READWRITE);
    old_process.exec("INSERT INTO tuning (device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, "
                     "code_version, channels_per_group, x_dtype, y_dtype, size_class, elems_per_load, warps, stages, "
                     "programs_per_sm, default_us, best_us, noise_us, tuned_shape, library_version, created_at) VALUES "
                     "('NVIDIA H200', 90, 132, 143771, 61440, 'abc123-0011223344556677', 32, 'bf16', 'bf16', "
                     "'dram-split', 32, 16, 1, 2, 10, 9, 0.1, 's', '0.1.0', 1)");
  }
  Store s(path, Store::Mode::ReadWrite);
  const auto saved = s.find_tuning(key(32));
  REQUIRE(saved.has_value());
  CHECK(saved->winner == gnsilu::LaunchConfig{32, 16, 1, 2});
}

TEST_CASE("layout and activation are key columns: an nhwc / none entry lives beside its nchw / silu twin") {
  TempDir dir("cache-test");
  const std::string path = dir.file("v2.sqlite");
  schema_2_file(path);
  Store s(path, Store::Mode::ReadWrite);
  REQUIRE(s.writable());
  TuningKey twin = key(4);
  twin.layout = gnsilu::Layout::ChannelsLast;
  twin.activation = gnsilu::Activation::None;
  CHECK_FALSE(s.find_tuning(twin).has_value());  // the migrated nchw / silu entry is not the twin's
  REQUIRE(s.put_tuning(entry(twin, 32)));
  CHECK(s.all_tuning().size() == 3);
  const auto old_one = s.find_tuning(key(4));
  const auto new_one = s.find_tuning(twin);
  REQUIRE(old_one.has_value());
  REQUIRE(new_one.has_value());
  CHECK(old_one->winner.warps == 4);
  CHECK(old_one->key.layout == gnsilu::Layout::ChannelsFirst);
  CHECK(new_one->winner.warps == 32);
  CHECK(new_one->key == twin);
  CHECK(new_one->candidates.size() == 3);
  // Only the layout differs, or only the activation: separate entries too.
  TuningKey nhwc_silu = key(4), nchw_none = key(4);
  nhwc_silu.layout = gnsilu::Layout::ChannelsLast;
  nchw_none.activation = gnsilu::Activation::None;
  REQUIRE(s.put_tuning(entry(nhwc_silu, 2)));
  REQUIRE(s.put_tuning(entry(nchw_none, 1)));
  CHECK(s.all_tuning().size() == 5);
  CHECK(s.find_tuning(nhwc_silu)->winner.warps == 2);
  CHECK(s.find_tuning(nchw_none)->winner.warps == 1);
  CHECK(s.find_tuning(twin)->winner.warps == 32);
  // Replacing and removing touch only the entry of that key.
  REQUIRE(s.put_tuning(entry(twin, 16)));
  CHECK(s.all_tuning().size() == 5);
  CHECK(s.find_tuning(key(4))->winner.warps == 4);
  REQUIRE(s.remove_tuning(twin));
  CHECK_FALSE(s.find_tuning(twin).has_value());
  CHECK(s.find_tuning(key(4)).has_value());
  CHECK(s.all_tuning().size() == 4);
}

namespace {

const char* const kSchema3Columns =
    "device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version, channels_per_group, x_dtype, "
    "y_dtype, size_class, layout, activation, elems_per_load, warps, stages, programs_per_sm, default_us, best_us, "
    "noise_us, tuned_shape, library_version, created_at";

// A row of the tuning table as the gnsilu of schema 3 wrote it: what the entry was tuned on only as text, the path
// only in the size class.
std::string schema_3_row(int64_t cpg, const std::string& size_class, const std::string& layout, const std::string& shape) {
  return std::string("INSERT INTO tuning (") + kSchema3Columns + ") VALUES ('NVIDIA H200', 90, 132, 143771, 61440, " +
         "'abc123-0011223344556677', " + std::to_string(cpg) + ", 'bf16', 'bf16', '" + size_class + "', '" + layout +
         "', 'silu', 8, 4, 2, 8, 300.5, 250.25, 2.5, '" + shape + "', '0.1.0', 1764430000)";
}

TuningKey key_of(int64_t cpg, const std::string& size_class, gnsilu::Layout layout) {
  TuningKey k = key(cpg);
  k.size_class = size_class;
  k.layout = layout;
  return k;
}

}  // namespace

TEST_CASE("schema 3 migrates to 4: what entries were tuned on becomes typed columns, read once from the text") {
  TempDir dir("cache-test");
  const std::string path = dir.file("v3.sqlite");
  REQUIRE(Store::create_at_version(path, 3));
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    REQUIRE(db.execAndGet("PRAGMA user_version").getInt() == 3);
    db.exec(schema_3_row(4, "dram-split", "nchw", "1x128x1024x1024 G=32"));
    db.exec(schema_3_row(8, "l2-fused", "nhwc", "2x512x64x64 G=16"));
    db.exec(schema_3_row(16, "dram-split", "nchw", "s"));  // text that never was a shape
    for (int id = 1; id <= 3; ++id) {
      db.exec("INSERT INTO timings (tuning_id, elems_per_load, warps, stages, programs_per_sm, median_us, noise_us, "
              "samples, status) VALUES (" + std::to_string(id) + ", 16, 8, 1, 4, 260, 1.5, 9, 'ok')");
    }
    db.exec("PRAGMA journal_mode = DELETE");
  }
  // The entries as a reading command sees them (through an upgraded copy in memory: the file is not changed).
  const std::string before = read_bytes(path);
  std::vector<TuningEntry> copied;
  {
    const auto s = Store::read_upgraded(path);
    REQUIRE(s->usable());
    copied = s->all_tuning();
  }
  CHECK(read_bytes(path) == before);
  REQUIRE(copied.size() == 3);
  {
    Store s(path, Store::Mode::ReadWrite);
    REQUIRE(s.writable());
    CHECK(s.schema_version() == kSchemaVersion);
    const auto all = s.all_tuning();
    REQUIRE(all.size() == 3);
    for (std::size_t i = 0; i < all.size(); ++i) {  // the same entries from the migrated file as from the copy
      CHECK(all[i].key == copied[i].key);
      CHECK(all[i].winner == copied[i].winner);
      CHECK(all[i].best_us == copied[i].best_us);
      CHECK(all[i].tuned_shape == copied[i].tuned_shape);
      CHECK(all[i].created_at == copied[i].created_at);
      REQUIRE(all[i].candidates.size() == 1);
      CHECK(all[i].candidates[0].config == gnsilu::LaunchConfig{16, 8, 1, 4});
    }
    CHECK(all[0].key == key(4));
    CHECK(all[0].tuned_shape == TunedShape{{1, 128, 1024, 1024}, 32, gnsilu::Path::Split});
    CHECK(all[0].tuned_shape.text() == "1x128x1024x1024 G=32");
    CHECK(all[1].key == key_of(8, "l2-fused", gnsilu::Layout::ChannelsLast));
    CHECK(all[1].tuned_shape == TunedShape{{2, 512, 64, 64}, 16, gnsilu::Path::Fused});
    // Not known, but the entry and its winner stay.
    CHECK(all[2].tuned_shape == TunedShape{{}, 0, gnsilu::Path::Split});
    CHECK(all[2].winner == gnsilu::LaunchConfig{8, 4, 2, 8});
    CHECK(s.find_tuning(key_of(8, "l2-fused", gnsilu::Layout::ChannelsLast))->tuned_shape == all[1].tuned_shape);
  }
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    CHECK(db.execAndGet("PRAGMA user_version").getInt() == kSchemaVersion);
    CHECK(db.execAndGet("PRAGMA integrity_check").getString() == "ok");
    SQLite::Statement rows(db, "SELECT tuned_dims, tuned_groups, path, tuned_shape FROM tuning ORDER BY id");
    std::vector<std::string> got;
    while (rows.executeStep()) {
      got.push_back(rows.getColumn(0).getString() + "|" + std::to_string(rows.getColumn(1).getInt64()) + "|" +
                    rows.getColumn(2).getString() + "|" + rows.getColumn(3).getString());
    }
    CHECK(got == std::vector<std::string>{"1x128x1024x1024|32|split|1x128x1024x1024 G=32",
                                          "2x512x64x64|16|fused|2x512x64x64 G=16", "|0|split|s"});
    // A process of schema 3 that had the file open before the migration still saves as it did, without the typed
    // columns: its entry reads through its text.
    db.exec(schema_3_row(32, "l2-fused", "nchw", "1x64x32x32 G=8"));
  }
  Store s(path, Store::Mode::ReadWrite);
  REQUIRE(s.writable());
  const auto saved = s.find_tuning(key_of(32, "l2-fused", gnsilu::Layout::ChannelsFirst));
  REQUIRE(saved.has_value());
  CHECK(saved->tuned_shape == TunedShape{{1, 64, 32, 32}, 8, gnsilu::Path::Fused});
  // What this gnsilu saves has both: the typed columns, and the text for such processes.
  TuningEntry e = entry(key(64));
  e.tuned_shape = {{1, 256, 4096}, 64, gnsilu::Path::Fused};
  REQUIRE(s.put_tuning(e));
  CHECK(s.find_tuning(key(64))->tuned_shape == e.tuned_shape);
  {
    SQLite::Database db(path, SQLite::OPEN_READONLY);
    CHECK(db.execAndGet("SELECT tuned_dims || '|' || tuned_groups || '|' || path || '|' || tuned_shape FROM tuning "
                        "WHERE channels_per_group = 64").getString() == "1x256x4096|64|fused|1x256x4096 G=64");
  }
  // An entry whose tuned shape would not read back as written is refused; the store stays writable.
  e.tuned_shape.dims = {1, 0, 4096};
  CHECK_FALSE(s.put_tuning(e));
  e.tuned_shape = {{1, 256, 4096}, 64, static_cast<gnsilu::Path>(7)};
  CHECK_FALSE(s.put_tuning(e));
  CHECK(s.writable());
  CHECK(s.find_tuning(key(64))->tuned_shape == TunedShape{{1, 256, 4096}, 64, gnsilu::Path::Fused});
}

TEST_CASE("an older schema read-only: refused as before; read_upgraded reads it through a copy, never writing") {
  TempDir dir("cache-test");
  const std::string path = dir.file("v2.sqlite");
  schema_2_file(path);
  const std::string before = read_bytes(path);
  {
    Store s(path, Store::Mode::ReadOnly);
    CHECK_FALSE(s.usable());
    CHECK(s.problem().find("older schema (2)") != std::string::npos);
    CHECK(s.all_tuning().empty());
  }
  {
    const auto s = Store::read_upgraded(path);
    REQUIRE(s->usable());
    CHECK_FALSE(s->writable());
    CHECK(s->schema_version() == kSchemaVersion);
    const auto all = s->all_tuning();
    REQUIRE(all.size() == 2);
    CHECK(all[0].key.layout == gnsilu::Layout::ChannelsFirst);
    CHECK(all[0].key.activation == gnsilu::Activation::SiLU);
    CHECK(all[1].candidates.size() == 3);
    CHECK(s->find_tuning(key(4)).has_value());
    CHECK(s->kernel_count() == 1);
    CHECK(s->find_kernel({90, "v", "bf16-bf16-e16-w8-s1"}).has_value());
    CHECK_FALSE(s->put_tuning(entry(key(8))));
    CHECK(s->claim("k", "me", 5) == Store::Claim::Unavailable);
  }
  CHECK(read_bytes(path) == before);
  // A current file reads the same as through Store(ReadOnly); a foreign or newer one stays refused.
  const std::string current = populated(dir, "v3.sqlite", 2);
  CHECK(Store::read_upgraded(current)->all_tuning().size() == 2);
  const std::string other = dir.file("other.sqlite");
  {
    SQLite::Database db(other, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("CREATE TABLE songs (title TEXT)");
  }
  CHECK_FALSE(Store::read_upgraded(other)->usable());
  CHECK_FALSE(Store::read_upgraded(dir.file("missing.sqlite"))->usable());
  CHECK_FALSE(fs::exists(dir.file("missing.sqlite")));
  // Damage in an older file is found in its copy before it is migrated.
  const std::string damaged = dir.file("v2-damaged.sqlite");
  schema_2_file(damaged);
  std::string bytes = read_bytes(damaged);
  REQUIRE(bytes.size() > 2 * 4096);
  for (std::size_t page = 1; page * 4096 < bytes.size(); ++page) bytes[page * 4096] = static_cast<char>(0x7F);
  write_bytes(damaged, bytes);
  {
    const auto s = Store::read_upgraded(damaged);
    CHECK_FALSE(s->usable());
    CHECK(s->all_tuning().empty());
  }
  CHECK(read_bytes(damaged) == bytes);
}
