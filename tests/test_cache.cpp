// The persistent cache without a GPU: schema and migrations, round trips, key composition, layering, leases,
// many processes on one file, and every fault (corrupt, truncated, other schema, not ours, unwritable, full
// disk, locked): the store never throws, never changes a file it cannot use, and says why.
#include <doctest/doctest.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <SQLiteCpp/SQLiteCpp.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.hpp"
#include "cache/lease.hpp"
#include "base/log.hpp"
#include "cache/store.hpp"
#include "cache_samples.hpp"
#include "temp_dir.hpp"

using namespace gnsilu::cache;
namespace fs = std::filesystem;
using testing::TempDir;

namespace {

TuningKey key(int64_t cpg = 4, const std::string& device = "NVIDIA H200") {
  return testing::sample_key(cpg, "abc123-0011223344556677", device);  // bf16 in and out
}

// Fractional times and a large shape, so that round trips of every field show.
TuningEntry entry(const TuningKey& k, int warps = 4) {
  TuningEntry e = testing::sample_entry(k, {8, warps, 2, 8}, 2.5);
  e.default_us = 300.5;
  e.best_us = 250.25;
  e.tuned_shape = {{1, 128, 1024, 1024}, 32, gnsilu::Path::Split};
  e.created_at = 1764430000;
  e.candidates = {{{16, 8, 1, 4}, 300.5, 2.0, 15, "ok"}, {{8, warps, 2, 8}, 250.25, 2.5, 15, "ok"},
                  {{32, 16, 1, 2}, 0, 0, 0, "failed: compile error"}};
  return e;
}

using testing::read_bytes;
using testing::write_bytes;

// A populated cache file (rollback journal, so that its bytes are all in the one file).
std::string populated(const TempDir& dir, const std::string& name, int entries) {
  const std::string path = dir.file(name);
  {
    Store s(path, Store::Mode::ReadWrite);
    REQUIRE(s.writable());
    for (int i = 0; i < entries; ++i) REQUIRE(s.put_tuning(entry(key(i + 1))));
    REQUIRE(s.put_kernel({90, "v", "bf16-bf16-e16-w8-s1"}, {true, std::vector<char>(5000, 'k'), {"a", "b", "c", "d"}, "--fmad=false", "13.0"}));
  }
  SQLite::Database db(path, SQLite::OPEN_READWRITE);
  db.exec("PRAGMA journal_mode = DELETE");
  return path;
}

}  // namespace

TEST_CASE("a new file gets the current schema; entries and kernels round-trip") {
  TempDir dir("cache-test");
  Store s(dir.file("sub/dir/cache.sqlite"), Store::Mode::ReadWrite);
  REQUIRE(s.writable());
  CHECK(s.schema_version() == kSchemaVersion);
  CHECK_FALSE(s.find_tuning(key()).has_value());
  const TuningEntry e = entry(key());
  REQUIRE(s.put_tuning(e));
  const auto got = s.find_tuning(key());
  REQUIRE(got.has_value());
  CHECK(got->key == e.key);
  CHECK(got->winner == e.winner);
  CHECK(got->default_us == e.default_us);
  CHECK(got->best_us == e.best_us);
  CHECK(got->noise_us == e.noise_us);
  CHECK(got->tuned_shape == e.tuned_shape);
  CHECK(got->created_at == e.created_at);
  REQUIRE(got->candidates.size() == 3);
  CHECK(got->candidates[2].status == "failed: compile error");
  CHECK(got->candidates[1].config == e.winner);
  // Replacing keeps one entry per key.
  REQUIRE(s.put_tuning(entry(key(), 16)));
  CHECK(s.find_tuning(key())->winner.warps == 16);
  CHECK(s.all_tuning().size() == 1);
  CHECK(s.find_tuning(key())->candidates.size() == 3);

  const KernelKey kk{90, "v1", "bf16-bf16-e16-w8-s1"};
  KernelImage image{true, std::vector<char>{'\0', 'E', 'L', 'F', '\x7f', '\0'}, {"_Z1a", "_Z1b", "_Z1c", "_Z1d"}, "--fmad=false", "13.0"};
  REQUIRE(s.put_kernel(kk, image));
  const auto k = s.find_kernel(kk);
  REQUIRE(k.has_value());
  CHECK(k->image == image.image);
  CHECK(k->lowered_names == image.lowered_names);
  CHECK(k->options == image.options);
  CHECK(s.kernel_count() == 1);
  CHECK_FALSE(s.find_kernel({80, "v1", "bf16-bf16-e16-w8-s1"}).has_value());
}

TEST_CASE("every key field separates entries") {
  TempDir dir("cache-test");
  Store s(dir.file("c.sqlite"), Store::Mode::ReadWrite);
  std::vector<TuningKey> keys(12, key());
  keys[1].device.name = "NVIDIA H100 80GB HBM3";
  keys[2].device.arch = 89;
  keys[3].device.sms = 114;
  keys[4].device.memory_mib = 81559;
  keys[5].code_version = "other";
  keys[6].channels_per_group = 16;
  keys[7].y_dtype = gnsilu::DType::FP16;
  keys[8].size_class = "l2-split";
  keys[9].layout = gnsilu::Layout::ChannelsLast;
  keys[10].activation = gnsilu::Activation::None;
  keys[11].layout = gnsilu::Layout::ChannelsLast;
  keys[11].activation = gnsilu::Activation::None;
  for (std::size_t i = 0; i < keys.size(); ++i) REQUIRE(s.put_tuning(entry(keys[i], static_cast<int>(i + 1))));
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(s.find_tuning(keys[i])->winner.warps == static_cast<int>(i + 1));
  CHECK(s.all_tuning().size() == keys.size());
  std::vector<std::string> texts;
  for (const auto& k : keys) texts.push_back(k.text());
  std::sort(texts.begin(), texts.end());
  CHECK(std::unique(texts.begin(), texts.end()) == texts.end());
}

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

TEST_CASE("shapes as text: one form, written and read by one pair of functions; the old tuned-shape text read once") {
  CHECK(shape_to_text(std::vector<int64_t>{1, 512, 16384}) == "1x512x16384");
  CHECK(shape_to_text(std::vector<int64_t>{}) == "");
  CHECK(shape_from_text("1x512x16384") == std::vector<int64_t>{1, 512, 16384});
  CHECK(shape_from_text("7") == std::vector<int64_t>{7});
  CHECK(shape_from_text("1x0512") == std::vector<int64_t>{1, 512});
  for (const char* bad : {"", "x", "1x", "x1", "1xx2", "1xax2", "1x-2", "1x+2", "1x0", "1 x2", "1x2 ", "99999999999999999999"}) {
    CHECK_MESSAGE(!shape_from_text(bad).has_value(), bad);
  }
  std::string problem;
  CHECK_FALSE(shape_from_text("1xax2", &problem).has_value());
  CHECK(problem == "\"a\" is not a positive whole number");
  CHECK_FALSE(shape_from_text("1x0", &problem).has_value());
  CHECK(problem == "\"0\" is out of range");

  const TunedShape split{{1, 512, 16384}, 32, gnsilu::Path::Split};
  CHECK(split.text() == "1x512x16384 G=32");
  CHECK(TunedShape{}.text() == "");
  CHECK(fmt::format("tuned on {}", split) == "tuned on 1x512x16384 G=32");
  std::ostringstream out;
  out << split;
  CHECK(out.str() == "1x512x16384 G=32");
  CHECK(tuned_shape_from_legacy("1x512x16384 G=32", "dram-split") == split);
  CHECK(tuned_shape_from_legacy("1x512x16384 G=32", "l2-fused") == TunedShape{{1, 512, 16384}, 32, gnsilu::Path::Fused});
  for (const char* bad : {"s", "", "1x512x16384", "1x512 G=", "1x512 G=0", "1x512 G=3x4", "G=32", " G=32", "1x512 G=-1",
                          "1x512  G=2", "1x512 G=2 "}) {
    const TunedShape t = tuned_shape_from_legacy(bad, "dram-split");
    CHECK_MESSAGE((t.dims.empty() && t.groups == 0 && t.path == gnsilu::Path::Split), bad);
  }
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

TEST_CASE("keys with a layout or activation no name stands for: refused on put, rows of unknown texts skipped") {
  TempDir dir("cache-test");
  const std::string path = dir.file("c.sqlite");
  Store s(path, Store::Mode::ReadWrite);
  REQUIRE(s.put_tuning(entry(key(4))));
  TuningKey bad_layout = key(8), bad_activation = key(8);
  bad_layout.layout = static_cast<gnsilu::Layout>(7);
  bad_activation.activation = static_cast<gnsilu::Activation>(-3);
  CHECK_FALSE(s.put_tuning(entry(bad_layout)));
  CHECK_FALSE(s.put_tuning(entry(bad_activation)));
  CHECK(s.writable());  // a refused key is not a fault of the file
  CHECK(s.all_tuning().size() == 1);
  CHECK(s.put_tuning(entry(key(8))));
  {
    // A row another program (or damage) gave a layout this gnsilu does not know.
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    db.exec("UPDATE tuning SET layout = 'nchw16c' WHERE channels_per_group = 8");
  }
  CHECK(s.all_tuning().size() == 1);
  CHECK_FALSE(s.find_tuning(key(8)).has_value());
  CHECK(s.find_tuning(key(4)).has_value());
  CHECK(s.usable());
}

TEST_CASE("files that are not usable caches are reported and never modified") {
  TempDir dir("cache-test");
  SUBCASE("random bytes") {
    const std::string path = dir.file("garbage.sqlite");
    std::mt19937 rng(5);
    std::string bytes(20000, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    write_bytes(path, bytes);
    {
      Store s(path, Store::Mode::ReadWrite);
      CHECK_FALSE(s.usable());
      CHECK_FALSE(s.find_tuning(key()).has_value());
      CHECK_FALSE(s.put_tuning(entry(key())));
      CHECK_FALSE(s.put_kernel({90, "v", "x"}, {true, {'a'}, {"n"}, "", ""}));
      CHECK(s.claim("k", "me", 10) == Store::Claim::Unavailable);
    }
    CHECK(read_bytes(path) == bytes);
  }
  SUBCASE("a truncated cache") {
    const std::string path = populated(dir, "full.sqlite", 40);
    std::string bytes = read_bytes(path);
    REQUIRE(bytes.size() > 8192);
    bytes.resize(bytes.size() / 3);
    write_bytes(path, bytes);
    {
      Store s(path, Store::Mode::ReadWrite);
      // Either refused at open or at the first read of a missing page: never an exception, never a write.
      for (int i = 1; i <= 40; ++i) s.find_tuning(key(i));
      s.find_kernel({90, "v", "bf16-bf16-e16-w8-s1"});
      s.put_tuning(entry(key(99)));
      CHECK_FALSE(s.writable());
      CHECK_FALSE(s.problem().empty());
    }
    CHECK(read_bytes(path) == bytes);
  }
  SUBCASE("a damaged page in a cache") {
    const std::string path = populated(dir, "full.sqlite", 60);
    std::string bytes = read_bytes(path);
    // The type byte of every b-tree page after the first: structural damage SQLite's checks find.
    for (std::size_t page = 1; page * 4096 < bytes.size(); page += 2) bytes[page * 4096] = static_cast<char>(0x7F);
    write_bytes(path, bytes);
    {
      Store s(path, Store::Mode::ReadWrite);
      for (int i = 1; i <= 60; ++i) s.find_tuning(key(i));
      s.all_tuning();
      s.put_tuning(entry(key(99)));
    }
    CHECK(read_bytes(path) == bytes);
  }
  SUBCASE("another application's database") {
    const std::string path = dir.file("other.sqlite");
    {
      SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
      db.exec("CREATE TABLE songs (title TEXT)");
    }
    const std::string before = read_bytes(path);
    {
      Store s(path, Store::Mode::ReadWrite);
      CHECK_FALSE(s.usable());
      CHECK(s.problem().find("not a gnsilu cache") != std::string::npos);
      CHECK_FALSE(s.put_tuning(entry(key())));
    }
    CHECK(read_bytes(path) == before);
  }
  SUBCASE("a path that cannot be created") {
    Store s("/proc/gnsilu-no-such-dir/cache.sqlite", Store::Mode::ReadWrite);
    CHECK_FALSE(s.usable());
    CHECK_FALSE(s.find_tuning(key()).has_value());
    CHECK_FALSE(s.put_tuning(entry(key())));
  }
  SUBCASE("a folder where the file should be") {
    fs::create_directories(dir.file("a-folder"));
    Store s(dir.file("a-folder"), Store::Mode::ReadWrite);
    CHECK_FALSE(s.usable());
    CHECK_FALSE(s.put_tuning(entry(key())));
  }
}

TEST_CASE("a compiled kernel whose bytes changed in the file is ignored") {
  TempDir dir("cache-test");
  const std::string path = dir.file("k.sqlite");
  const KernelKey kk{90, "v1", "bf16-bf16-e16-w8-s1"};
  {
    Store s(path, Store::Mode::ReadWrite);
    REQUIRE(s.put_kernel(kk, {true, std::vector<char>(4000, 'c'), {"a", "b", "c", "d"}, "", ""}));
  }
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    db.exec("UPDATE kernels SET image = zeroblob(4000)");  // a blob SQLite itself cannot check
  }
  Store s(path, Store::Mode::ReadWrite);
  CHECK_FALSE(s.find_kernel(kk).has_value());
  // Saving it again repairs the row.
  REQUIRE(s.put_kernel(kk, {true, std::vector<char>(4000, 'c'), {"a", "b", "c", "d"}, "", ""}));
  CHECK(s.find_kernel(kk).has_value());
}

TEST_CASE("a full disk: writes fail cleanly, the file stays sound, earlier entries stay readable") {
  TempDir dir("cache-test");
  SUBCASE("/dev/full") {
    // /dev/full reads as empty and fails every write with ENOSPC.
    const std::string path = dir.file("full-disk.sqlite");
    fs::create_symlink("/dev/full", path);
    Store s(path, Store::Mode::ReadWrite);
    CHECK_FALSE(s.put_tuning(entry(key())));
    CHECK_FALSE(s.writable());
    CHECK_FALSE(s.find_tuning(key()).has_value());
  }
  SUBCASE("the file size limit reached while writing") {
    const std::string path = populated(dir, "growing.sqlite", 5);
    const auto limit = static_cast<rlim_t>(fs::file_size(path) + 16 * 1024);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      signal(SIGXFSZ, SIG_IGN);  // writes past the limit then fail with EFBIG instead of killing the process
      rlimit r{limit, limit};
      setrlimit(RLIMIT_FSIZE, &r);
      int refused = 0, crashed = 0;
      try {
        Store s(path, Store::Mode::ReadWrite);
        for (int i = 0; i < 400; ++i) refused += !s.put_tuning(entry(key(100 + i)));
        for (int i = 1; i <= 5; ++i) crashed += !s.find_tuning(key(i)).has_value();
      } catch (...) {
        crashed = 1000;
      }
      _exit(refused > 0 && crashed == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    SQLite::Database db(path, SQLite::OPEN_READONLY);
    CHECK(db.execAndGet("PRAGMA integrity_check").getString() == "ok");
    Store after(path, Store::Mode::ReadWrite);
    for (int i = 1; i <= 5; ++i) CHECK(after.find_tuning(key(i)).has_value());
  }
}

TEST_CASE("read-only layers are read, never written") {
  TempDir dir("cache-test");
  const std::string path = populated(dir, "shipped.sqlite", 3);
  const std::string before = read_bytes(path);
  {
    Store s(path, Store::Mode::ReadOnly);
    CHECK(s.usable());
    CHECK_FALSE(s.writable());
    CHECK(s.find_tuning(key(2)).has_value());
    CHECK(s.find_kernel({90, "v", "bf16-bf16-e16-w8-s1"}).has_value());
    CHECK_FALSE(s.put_tuning(entry(key(7))));
    CHECK(s.claim("k", "me", 5) == Store::Claim::Unavailable);
  }
  CHECK(read_bytes(path) == before);
}

TEST_CASE("a file locked by another process: no error reaches the caller, and later writes succeed") {
  TempDir dir("cache-test");
  const std::string path = dir.file("locked.sqlite");
  Store s(path, Store::Mode::ReadWrite, 100);
  REQUIRE(s.put_tuning(entry(key(1))));
  {
    SQLite::Database holder(path, SQLite::OPEN_READWRITE, 0);
    holder.exec("BEGIN EXCLUSIVE");
    // The holder is this thread, so a put that waited for the lock would never return: it must give up (after its
    // 100 ms busy timeout) and report that nothing was stored. What it waited is not asserted.
    CHECK_FALSE(s.put_tuning(entry(key(2))));
    s.find_tuning(key(1));  // may or may not see through the lock; must not throw
    holder.exec("COMMIT");
  }
  CHECK(s.writable());
  CHECK(s.put_tuning(entry(key(2))));
  CHECK(s.find_tuning(key(2)).has_value());
}

TEST_CASE("layering: the user file wins, shared files are read in order, writes go to the user file") {
  TempDir dir("cache-test");
  const std::string shared1 = populated(dir, "shared1.sqlite", 0);
  const std::string shared2 = populated(dir, "shared2.sqlite", 0);
  {
    Store a(shared1, Store::Mode::ReadWrite);
    REQUIRE(a.put_tuning(entry(key(1), 11)));
    REQUIRE(a.put_tuning(entry(key(2), 12)));
    Store b(shared2, Store::Mode::ReadWrite);
    REQUIRE(b.put_tuning(entry(key(2), 22)));
    REQUIRE(b.put_tuning(entry(key(3), 23)));
  }
  for (const auto& p : {shared1, shared2}) {
    SQLite::Database db(p, SQLite::OPEN_READWRITE);
    db.exec("PRAGMA journal_mode = DELETE");
  }
  const std::string before1 = read_bytes(shared1), before2 = read_bytes(shared2);
  Settings settings;
  settings.user_path = dir.file("user.sqlite");
  settings.shared_paths = {shared1, shared2};
  LayeredCache cache(settings);
  CHECK(cache.find_tuning(key(1))->winner.warps == 11);
  CHECK(cache.find_tuning(key(2))->winner.warps == 12);  // the first shared file wins over the second
  CHECK(cache.find_tuning(key(3))->winner.warps == 23);
  CHECK_FALSE(cache.find_tuning(key(4)).has_value());
  REQUIRE(cache.put_tuning(entry(key(2), 2)));           // the user's entry wins over both
  CHECK(cache.find_tuning(key(2))->winner.warps == 2);
  REQUIRE(cache.put_tuning(entry(key(4), 4)));
  CHECK(cache.find_tuning(key(4))->winner.warps == 4);
  CHECK(read_bytes(shared1) == before1);
  CHECK(read_bytes(shared2) == before2);

  Settings none;
  LayeredCache memory_only(none);
  CHECK(memory_only.user() == nullptr);
  CHECK_FALSE(memory_only.put_tuning(entry(key(1))));
  CHECK_FALSE(memory_only.find_tuning(key(1)).has_value());
}

TEST_CASE("size classes: fits L2 or not, and the path") {
  const std::size_t l2 = std::size_t{60} << 20;
  CHECK(size_class_of(l2, l2, "fused") == "l2-fused");
  CHECK(size_class_of(l2, l2, "split") == "l2-split");
  CHECK(size_class_of(l2 + 1, l2, "split") == "dram-split");
  CHECK(size_class_of(l2 + 1, l2, "fused") == "dram-fused");
}

TEST_CASE("settings from the environment") {
  setenv("GNSILU_CACHE", "/tmp/x/c.sqlite", 1);
  setenv("GNSILU_CACHE_SHARED", "/a.sqlite:/b.sqlite::", 1);
  setenv("GNSILU_CACHE_BUSY_MS", "250", 1);
  Settings s = settings_from_environment();
  CHECK(s.user_path == "/tmp/x/c.sqlite");
  CHECK(s.shared_paths == std::vector<std::string>{"/a.sqlite", "/b.sqlite"});
  CHECK(s.busy_timeout_ms == 250);
  setenv("GNSILU_CACHE", "off", 1);
  CHECK(settings_from_environment().user_path.empty());
  unsetenv("GNSILU_CACHE");
  setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  CHECK(settings_from_environment().user_path == "/tmp/xdg/gnsilu/cache.sqlite");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("GNSILU_CACHE_SHARED");
  unsetenv("GNSILU_CACHE_BUSY_MS");
  CHECK(default_user_path().find("/.cache/gnsilu/cache.sqlite") != std::string::npos);
}

TEST_CASE("leases: one owner at a time, until released or expired") {
  TempDir dir("cache-test");
  Store s(dir.file("l.sqlite"), Store::Mode::ReadWrite);
  CHECK(s.claim("key", "a", 60) == Store::Claim::Acquired);
  CHECK(s.claim("key", "a", 60) == Store::Claim::Acquired);  // the owner may renew
  CHECK(s.claim("key", "b", 60) == Store::Claim::HeldByOther);
  CHECK(s.claim("other", "b", 60) == Store::Claim::Acquired);
  s.release("key", "b");  // not the owner: no effect
  CHECK(s.claim("key", "b", 60) == Store::Claim::HeldByOther);
  s.release("key", "a");
  CHECK(s.claim("key", "b", 0.05) == Store::Claim::Acquired);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(s.claim("key", "c", 60) == Store::Claim::Acquired);  // b's lease expired
  CHECK(s.claim("nan", "c", std::nan("")) == Store::Claim::Unavailable);  // refused, and the store stays writable
  CHECK(s.claim("negative", "c", -1) == Store::Claim::Unavailable);
  CHECK(s.writable());
  CHECK(s.claim("later", "c", 60) == Store::Claim::Acquired);
}

// The library's log lines while it lives (an extra sink on gnsilu's logger).
class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    gnsilu::detail::logger().sinks().push_back(sink_);
  }
  ~CapturedLog() {
    auto& sinks = gnsilu::detail::logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  int count(const std::string& text) const {
    int n = 0;
    const std::string all = out_.str();
    for (auto at = all.find(text); at != std::string::npos; at = all.find(text, at + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

const KernelKey kKernel{90, "v", "bf16-bf16-e16-w8-s1-nchw-silu"};
const KernelImage kImage{true, std::vector<char>(3000, 'x'), {"a", "b", "c", "d"}, "", ""};

TEST_CASE("cache files anyone else could write give their tuning entries, not their kernels") {
  TempDir dir("cache-test");
  const std::string shared_dir = dir.file("shared");
  fs::create_directories(shared_dir);
  const std::string shared = shared_dir + "/fleet.sqlite";
  {
    Store s(shared, Store::Mode::ReadWrite);
    REQUIRE(s.put_tuning(entry(key(4))));
    REQUIRE(s.put_kernel(kKernel, kImage));
  }
  auto layered = [&] { return LayeredCache(Settings{"", {shared}, 5000}); };
  fs::permissions(shared_dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(shared, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                              fs::perms::others_read);
  {
    LayeredCache c = layered();
    CHECK(c.find_kernel(kKernel));  // 0644 in a 0755 folder: trusted
    CHECK(c.find_tuning(key(4)));
  }
  fs::permissions(shared, fs::perms::group_write, fs::perm_options::add);  // group-writable, as under umask 002
  {
    CapturedLog log;
    LayeredCache c = layered();
    CHECK_FALSE(c.find_kernel(kKernel));
    CHECK_FALSE(c.find_kernel(kKernel));
    CHECK(c.find_tuning(key(4)));  // a configuration cannot change output bits
    CHECK(log.count("its compiled kernels are not loaded, because it is writable by its group") == 1);
    CHECK(log.count(shared) >= 1);
    CHECK(log.count("chmod go-w") == 1);
    setenv("GNSILU_CACHE_TRUST", "any", 1);  // the documented escape
    CHECK(layered().find_kernel(kKernel));
    unsetenv("GNSILU_CACHE_TRUST");
  }
  fs::permissions(shared, fs::perms::group_write, fs::perm_options::remove);
  fs::permissions(shared_dir, fs::perms::others_write, fs::perm_options::add);  // a world-writable folder
  CHECK_FALSE(Store(shared, Store::Mode::ReadOnly).code_trust().trusted);
  CHECK(Store(shared, Store::Mode::ReadOnly).code_trust().problem.find("folder") != std::string::npos);
  fs::permissions(shared_dir, fs::perms::sticky_bit, fs::perm_options::add);  // like /tmp: others cannot replace it
  CHECK(Store(shared, Store::Mode::ReadOnly).code_trust().trusted);
  fs::permissions(shared_dir, fs::perms::sticky_bit | fs::perms::others_write, fs::perm_options::remove);
  if (geteuid() == 0) {  // another user's file (root can make one)
    REQUIRE(chown(shared.c_str(), 65534, 65534) == 0);
    const CodeTrust t = Store(shared, Store::Mode::ReadOnly).code_trust();
    CHECK_FALSE(t.trusted);
    CHECK(t.problem.find("owned by uid 65534") != std::string::npos);
    CHECK(layered().find_tuning(key(4)));
  } else {
    MESSAGE("not root: the file owned by another user was not made");
  }
}

TEST_CASE("a new cache file is 0600 in a new 0700 folder, whatever the umask") {
  TempDir dir("cache-test");
  const mode_t old = umask(002);
  const std::string path = dir.file("new-folder/deeper/cache.sqlite");
  {
    Store s(path, Store::Mode::ReadWrite);
    REQUIRE(s.writable());
    REQUIRE(s.put_tuning(entry(key(4))));
    REQUIRE(s.put_kernel(kKernel, kImage));
    CHECK(s.code_trust().trusted);
    CHECK(s.find_kernel(kKernel));
  }
  umask(old);
  struct stat file {}, folder {};
  REQUIRE(stat(path.c_str(), &file) == 0);
  REQUIRE(stat(fs::path(path).parent_path().c_str(), &folder) == 0);
  CHECK((file.st_mode & 0777) == 0600);
  CHECK((folder.st_mode & 0777) == 0700);
  for (const char* suffix : {"-wal", "-shm"}) {
    struct stat side {};
    if (stat((path + suffix).c_str(), &side) == 0) CHECK((side.st_mode & 0077) == 0);
  }
  const mode_t existing_mode = 0755;
  fs::create_directories(dir.file("existing"));
  ::chmod(dir.file("existing").c_str(), existing_mode);
  { Store s(dir.file("existing/c.sqlite"), Store::Mode::ReadWrite); }
  struct stat existing {};
  REQUIRE(stat(dir.file("existing").c_str(), &existing) == 0);
  CHECK((existing.st_mode & 0777) == existing_mode);  // a folder that was there is left as it was
}

TEST_CASE("lease holders: identity as text, liveness from this host's processes") {
  const LeaseHolder me = LeaseHolder::self();
  CHECK(me.pid == getpid());
  CHECK(me.start_ticks > 0);
  CHECK(!me.host.empty());
  const auto parsed = LeaseHolder::parse(me.text());
  REQUIRE(parsed);
  CHECK(parsed->text() == me.text());
  CHECK(parsed->same_process(me));
  CHECK(parsed->liveness() == LeaseHolder::Liveness::Alive);
  for (const char* other : {"me", "a", "host:123:456", "", "host=x;pid=1", "host=x;boot=b;ns=n;pid=z;start=1;thread=t;since=0"})
    CHECK_FALSE(LeaseHolder::parse(other));

  LeaseHolder reused = me;  // this pid, another start time: a reused pid is not the holder
  reused.start_ticks += 1;
  CHECK(reused.liveness() == LeaseHolder::Liveness::Dead);
  LeaseHolder rebooted = me;
  rebooted.boot_id = "another-boot";
  CHECK(rebooted.liveness() == LeaseHolder::Liveness::Dead);
  LeaseHolder remote = me;
  remote.host = "another-host";
  CHECK(remote.liveness() == LeaseHolder::Liveness::Unknown);
  LeaseHolder container = me;
  container.pid_ns = "pid:[1]";
  CHECK(container.liveness() == LeaseHolder::Liveness::Unknown);

  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  LeaseHolder gone = me;
  gone.pid = child;
  CHECK(gone.liveness() == LeaseHolder::Liveness::Dead);
  CHECK_FALSE(process_start_ticks(child));
}

TEST_CASE("leases: a dead holder on this host is taken over at once, a remote one when it stops renewing") {
  TempDir dir("cache-test");
  const std::string path = dir.file("l.sqlite");
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    Store s(path, Store::Mode::ReadWrite);
    const bool ok = s.claim("key", LeaseHolder::self().text(), 3600) == Store::Claim::Acquired;
    _exit(ok ? 0 : 1);  // dies holding an hour-long lease
  }
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  Store s(path, Store::Mode::ReadWrite);
  const auto held = s.lease("key");
  REQUIRE(held);
  const auto holder = LeaseHolder::parse(held->owner);
  REQUIRE(holder);
  CHECK(holder->pid == child);
  const std::string me = LeaseHolder::self().text();
  CHECK(s.claim("key", me, 60) == Store::Claim::Acquired);
  CHECK(LeaseHolder::parse(s.lease("key")->owner)->pid == getpid());
  // A live holder is respected, whatever its lease's length.
  LeaseHolder other_thread = LeaseHolder::self();
  other_thread.thread = "another-thread";
  CHECK(s.claim("key", other_thread.text(), 60) == Store::Claim::HeldByOther);

  LeaseHolder remote = LeaseHolder::self();  // on "another host": only the expiry tells
  remote.host = "another-host";
  remote.pid = 1;
  CHECK(s.claim("remote", remote.text(), 3600) == Store::Claim::Acquired);
  CHECK(s.claim("remote", me, 60) == Store::Claim::HeldByOther);  // alive as far as anyone here can tell
  {
    // Its holder stopped renewing: the lease's expiry passes. Set in the file rather than waited for, so that no
    // clock decides the outcome.
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    SQLite::Statement expire(db, "UPDATE leases SET expires_at = ? WHERE key = 'remote'");
    expire.bind(1, unix_now() - 1);
    REQUIRE(expire.exec() == 1);
  }
  CHECK(s.claim("remote", me, 60) == Store::Claim::Acquired);  // not renewed: expired

  CHECK(s.claim("third", me, 60) == Store::Claim::Acquired);
  CHECK(s.claim("theirs", remote.text(), 60) == Store::Claim::Acquired);
  CHECK(s.release_process_leases(LeaseHolder::self()) == 3);  // key, remote, third: this process's (any thread)
  CHECK_FALSE(s.lease("key"));
  CHECK(s.lease("theirs"));
  CHECK(kLeaseHeartbeatSeconds * 3 <= kLeaseSeconds);  // a holder misses two renewals before it loses its lease
}

TEST_CASE("a heartbeat keeps a lease alive past its length, and stops with its owner") {
  TempDir dir("cache-test");
  const std::string path = dir.file("beat.sqlite");
  Store s(path, Store::Mode::ReadWrite);
  LeaseHolder remote = LeaseHolder::self();  // as a holder on another host: only renewals keep it
  remote.host = "another-host";
  const std::string me = LeaseHolder::self().text();
  REQUIRE(s.claim("k", remote.text(), 60) == Store::Claim::Acquired);
  auto expiry = [&] {
    SQLite::Database db(path, SQLite::OPEN_READONLY);
    SQLite::Statement q(db, "SELECT expires_at FROM leases WHERE key = 'k'");
    return q.executeStep() ? q.getColumn(0).getDouble() : -1.0;
  };
  // Wait for renewals, not for a time: each one must push the lease's expiry forward. The deadline only stops a
  // broken heartbeat from hanging the test; a loaded machine makes the wait longer, never the test fail.
  auto wait_for = [](const auto& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!done() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return done();
  };
  {
    const double claimed = expiry();
    LeaseHeartbeat beat(path, "k", remote.text(), 0.01, 3600);  // renews every 10 ms for an hour
    REQUIRE(wait_for([&] { return beat.renewals() >= 3; }));
    const double renewed = expiry();
    CHECK(renewed > claimed + 3000);  // claimed for 60 s, renewed for an hour
    REQUIRE(wait_for([&] { return expiry() > renewed; }));  // and again
    CHECK(s.claim("k", me, 60) == Store::Claim::HeldByOther);
    CHECK(LeaseHolder::parse(s.lease("k")->owner)->host == "another-host");
  }
  // Destroyed: its thread is joined, so nothing renews the lease any more.
  const double expiry_at_end = expiry();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // ten of its periods
  CHECK(expiry() == expiry_at_end);
  CHECK(s.lease("k")->owner == remote.text());
}

TEST_CASE("processes killed with SIGKILL while claiming, storing and releasing: the file stays whole, the next "
          "claim is at once") {
  TempDir dir("cache-test");
  const std::string path = dir.file("killed.sqlite");
  { Store s(path, Store::Mode::ReadWrite); }
  std::mt19937 random(1234);
  constexpr int kKills = 100;
  int integrity_failures = 0, bad_entries = 0, not_granted = 0, unheld = 0, odd_unheld = 0;
  double slowest = 0;
  for (int i = 0; i < kKills; ++i) {
    // Even children are killed a random time after their start (anywhere: opening, claiming, storing); odd ones a
    // random time after they first hold their never-released lease, so that, however loaded the machine, half of
    // the kills leave a dead holder's lease to take over.
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      close(ready[0]);
      Store s(path, Store::Mode::ReadWrite, 10000);
      const std::string me = LeaseHolder::self().text();
      for (int round = 0;; ++round) {  // what a tuning process does, until it is killed
        const int64_t cpg = 1 + (i * 7 + round) % 50;
        const std::string lease = key(cpg).text();
        if (s.claim(lease, me, kLeaseSeconds) == Store::Claim::Acquired) {
          s.put_tuning(entry(key(cpg), 1 << (round % 5)));
          s.release(lease, me);
        }
        // and one lease it never releases
        if (s.claim("held-" + std::to_string(i), me, 3600) == Store::Claim::Acquired && round == 0) {
          const char byte = 1;
          if (write(ready[1], &byte, 1) != 1) _exit(3);
        }
      }
    }
    close(ready[1]);
    if (i % 2 == 1) {
      // Until its lease is held. The bound only keeps a broken child from hanging the test (a child that cannot
      // claim in two minutes is a failure below, counted in odd_unheld), it is no expectation of speed.
      pollfd p{ready[0], POLLIN, 0};
      poll(&p, 1, 120000);
    }
    close(ready[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 40000)(random)));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);

    Store s(path, Store::Mode::ReadWrite);
    {
      SQLite::Database db(path, SQLite::OPEN_READONLY);
      SQLite::Statement q(db, "PRAGMA integrity_check");
      if (!q.executeStep() || q.getColumn(0).getString() != "ok") integrity_failures++;
    }
    for (const auto& e : s.all_tuning()) {  // every entry whole: what the child wrote, field for field
      const TuningEntry expected = entry(e.key, e.winner.warps);
      if (e.key.text() != key(e.key.channels_per_group).text() || e.candidates.size() != 3 ||
          e.tuned_shape != expected.tuned_shape || e.best_us != expected.best_us)
        bad_entries++;
    }
    const std::string held = "held-" + std::to_string(i);
    if (!s.lease(held)) {  // killed before its first claim: nothing to take over
      unheld++;
      if (i % 2 == 1) odd_unheld++;
    }
    const auto started = std::chrono::steady_clock::now();
    const bool got = s.claim(held, LeaseHolder::self().text(), 60) == Store::Claim::Acquired;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    slowest = std::max(slowest, seconds);
    if (!got) not_granted++;
    s.release(held, LeaseHolder::self().text());
  }
  MESSAGE(kKills << " kills: " << integrity_failures << " files failed integrity_check, " << bad_entries
                 << " entries not whole, " << not_granted << " dead holders' leases not granted at the first claim "
                 << "(slowest claim " << slowest << " s); " << kKills - unheld
                 << " of the killed processes held a lease");
  CHECK(integrity_failures == 0);
  CHECK(bad_entries == 0);
  CHECK(not_granted == 0);  // a dead holder's lease goes to the first claim: no waiting for its expiry
  CHECK(odd_unheld == 0);   // the odd half were killed holding one: takeover exercised every time
  Store s(path, Store::Mode::ReadWrite);
  CHECK(s.all_tuning().size() > 0);
}

TEST_CASE("eight processes at once on one file: every write lands, one lease per key") {
  TempDir dir("cache-test");
  const std::string path = dir.file("shared-by-8.sqlite");
  constexpr int kProcesses = 8, kKeys = 40;
  std::vector<pid_t> children;
  const std::string results = dir.file("claims");
  fs::create_directories(results);
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int failures = 0;
      {
        Store s(path, Store::Mode::ReadWrite, 10000);
        if (!s.writable()) failures++;
        // Everyone claims the same lease; the winner records it.
        if (s.claim("the-key", "owner-" + std::to_string(p), 60) == Store::Claim::Acquired) {
          std::ofstream(results + "/" + std::to_string(p)) << "won";
        }
        for (int k = 0; k < kKeys; ++k) {
          if (!s.put_tuning(entry(key(1000 * (p + 1) + k)))) failures++;
          if (!s.find_tuning(key(1000 * (p + 1) + k))) failures++;
          if (!s.put_tuning(entry(key(7), 1 + k % 16))) failures++;  // all fight over one key too
          const std::string variant = std::to_string(p * 1000 + k);
          if (!s.put_kernel({90, "v", variant}, {true, std::vector<char>(3000, 'x'), {"a", "b", "c", "d"}, "", ""})) failures++;
        }
      }
      _exit(failures == 0 ? 0 : 1);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
  }
  CHECK(failed == 0);
  Store s(path, Store::Mode::ReadWrite);
  CHECK(s.all_tuning().size() == static_cast<std::size_t>(kProcesses * kKeys + 1));
  CHECK(s.kernel_count() == kProcesses * kKeys);
  int winners = 0;
  for (const auto& f : fs::directory_iterator(results)) winners += f.is_regular_file();
  CHECK(winners == 1);
}
