// Export files and merging without a GPU: round trips through the export format and through SQLite, every kind
// of damaged or foreign input refused with a message naming the file and the field, conflicts resolved toward
// the better-measured entry, and entries for other devices or kernel versions set apart.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <SQLiteCpp/SQLiteCpp.h>

#include <nlohmann/json.hpp>

#include "runtime/kernels.hpp"
#include "cache/store.hpp"
#include "cache_samples.hpp"
#include "temp_dir.hpp"
#include "cache/transfer/transfer.hpp"

using namespace gnsilu::cache;
namespace fs = std::filesystem;
using testing::TempDir;

namespace {

TuningKey key(int64_t cpg, const std::string& device = "NVIDIA H200", const std::string& code = "v1") {
  return testing::sample_key(cpg, code, device);
}

// `ok_candidates` timed successfully and one failed: what better_measured counts.
TuningEntry entry(const TuningKey& k, int warps, double noise, int ok_candidates = 3, int64_t created = 1000) {
  TuningEntry e = testing::sample_entry(k, {16, warps, 1, 4}, noise);
  e.created_at = created;
  e.candidates.clear();
  for (int i = 0; i < ok_candidates; ++i) e.candidates.push_back({{16, 8, 1, 4}, 260.0 + i, 1.5, 9, "ok"});
  e.candidates.push_back({{32, 16, 1, 2}, 0, 0, 0, "compile failed: no"});
  return e;
}

KernelRecord kernel(int arch, const std::string& code = "v1") {
  KernelRecord k;
  k.key = {arch, code, "bf16-bf16-e16-w8-s1"};
  k.image.image = {'\x7f', 'E', 'L', 'F', '\0', '\x01', '\xff', '=', '+'};
  k.image.lowered_names = {"_Z1av", "_Z1bv", "_Z1cv", "_Z1dv"};
  k.image.options = "--fmad=false";
  k.image.nvrtc_version = "13.0";
  return k;
}

std::string corrupt(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("the export format round-trips every field, including kernel bytes of any length") {
  Bundle b;
  TuningKey nhwc_none = key(4);
  nhwc_none.layout = gnsilu::Layout::ChannelsLast;
  nhwc_none.activation = gnsilu::Activation::None;
  b.tuning = {entry(key(4), 8, 1.0), entry(key(16), 4, 2.0), entry(nhwc_none, 2, 1.0)};
  for (int n = 0; n < 5; ++n) {  // images of every length modulo 3 exercise base64 padding
    KernelRecord k = kernel(90 + n);
    k.image.image.resize(static_cast<std::size_t>(7 + n), 'z');
    b.kernels.push_back(k);
  }
  const Bundle back = parse_export(export_text(b), "test");
  REQUIRE(back.tuning.size() == 3);
  CHECK(back.tuning[0].key == b.tuning[0].key);
  CHECK(back.tuning[2].key == nhwc_none);
  CHECK(back.tuning[2].key.layout == gnsilu::Layout::ChannelsLast);
  CHECK(back.tuning[2].key.activation == gnsilu::Activation::None);
  CHECK(back.tuning[0].key.layout == gnsilu::Layout::ChannelsFirst);
  CHECK(back.tuning[0].key.activation == gnsilu::Activation::SiLU);
  CHECK(back.tuning[1].winner == b.tuning[1].winner);
  CHECK(back.tuning[0].candidates.size() == b.tuning[0].candidates.size());
  CHECK(back.tuning[0].candidates.back().status == "compile failed: no");
  CHECK(back.tuning[1].noise_us == 2.0);
  REQUIRE(back.kernels.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(back.kernels[i].key == b.kernels[i].key);
    CHECK(back.kernels[i].image.image == b.kernels[i].image.image);
    CHECK(back.kernels[i].image.lowered_names == b.kernels[i].image.lowered_names);
  }
}

TEST_CASE("a cache file and an export file read the same; writing is atomic") {
  TempDir dir("transfer-test");
  {
    Store s(dir.file("c.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(s.put_tuning(entry(key(8), 8, 1.0)));
    REQUIRE(s.put_kernel(kernel(90).key, kernel(90).image));
  }
  const Bundle from_sqlite = read_bundle(dir.file("c.sqlite"));
  REQUIRE(from_sqlite.tuning.size() == 1);
  REQUIRE(from_sqlite.kernels.size() == 1);
  write_export(from_sqlite, dir.file("e.json"));
  const Bundle from_json = read_bundle(dir.file("e.json"));
  CHECK(from_json.tuning[0].key == from_sqlite.tuning[0].key);
  CHECK(from_json.kernels[0].image.image == from_sqlite.kernels[0].image.image);
  CHECK(read_bundle(dir.file("e.json"), false).kernels.empty());
  for (const auto& f : fs::directory_iterator(dir.path)) CHECK(f.path().string().find(".tmp") == std::string::npos);
  CHECK_THROWS_AS(write_export(from_json, dir.file("no/such/folder/e.json")), TransferError);
}

TEST_CASE("damaged or foreign inputs are refused with the file and the field named") {
  TempDir dir("transfer-test");
  Bundle b;
  b.tuning = {entry(key(4), 8, 1.0)};
  b.kernels = {kernel(90)};
  const std::string good = export_text(b);
  auto message = [&](const std::string& text) {
    try {
      parse_export(text, "in.json");
    } catch (const TransferError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message("") .find("in.json: is not JSON") == 0);
  CHECK(message("{\"tuning\": []}").find("not a gnsilu cache export") != std::string::npos);
  CHECK(message(corrupt(good, "\"format_version\": " + std::to_string(kExportVersion), "\"format_version\": 99"))
            .find("version 99") != std::string::npos);
  CHECK(message(corrupt(good, "\"format_version\": " + std::to_string(kExportVersion), "\"format_version\": 0"))
            .find("version 0") != std::string::npos);
  CHECK(message(corrupt(good, "\"x_dtype\": \"bf16\"", "\"x_dtype\": \"int8\"")).find("x_dtype") != std::string::npos);
  CHECK(message(corrupt(good, "\"warps\": 8", "\"warps\": 1000")).find("tuning[0].candidates[0].config") != std::string::npos);
  CHECK(message(corrupt(good, "\"best_us\": 250.0", "\"best_us\": -1")).find("best_us") != std::string::npos);
  CHECK(message(corrupt(good, "\"channels_per_group\": 4", "\"channels_per_group\": \"4\"")).find("channels_per_group") !=
        std::string::npos);
  CHECK(message(corrupt(good, "\"image\": \"", "\"image\": \"!")).find("base64") != std::string::npos);
  CHECK(message(corrupt(good, "\"checksum\": \"", "\"checksum\": \"0")).find("checksum") != std::string::npos);
  CHECK(message(good.substr(0, good.size() / 2)).find("not JSON") != std::string::npos);
  // Layout and activation: known names only, strings only, and present in files of this format version.
  CHECK(message(corrupt(good, "\"layout\": \"nchw\"", "\"layout\": \"nchw16c\"")).find("tuning[0].key.layout: \"nchw16c\"") !=
        std::string::npos);
  CHECK(message(corrupt(good, "\"layout\": \"nchw\"", "\"layout\": 1")).find("tuning[0].key.layout: is not a string") !=
        std::string::npos);
  CHECK(message(corrupt(good, "\"activation\": \"silu\"", "\"activation\": \"gelu\"")).find("tuning[0].key.activation: \"gelu\"") !=
        std::string::npos);
  CHECK(message(corrupt(good, "\"activation\": \"silu\"", "\"activation\": null")).find("tuning[0].key.activation") !=
        std::string::npos);
  CHECK(message(corrupt(good, "\"layout\": \"nchw\",", "")).find("tuning[0].key: has no \"layout\"") != std::string::npos);
  CHECK(message(corrupt(good, "\"activation\": \"silu\",", "")).find("tuning[0].key: has no \"activation\"") !=
        std::string::npos);
  CHECK(message(good) == "accepted");

  CHECK_THROWS_AS(read_bundle(dir.file("missing.json")), TransferError);
  {
    std::ofstream f(dir.file("fake.sqlite"), std::ios::binary);
    f << std::string("SQLite format 3\0", 16) << std::string(5000, 'x');
  }
  CHECK_THROWS_AS(read_bundle(dir.file("fake.sqlite")), TransferError);
  CHECK(fs::file_size(dir.file("fake.sqlite")) == 16 + 5000);  // never modified
}

TEST_CASE("an export written before keys had layouts (format version 1) reads as nchw / silu") {
  Bundle b;
  b.tuning = {entry(key(4), 8, 1.0), entry(key(16), 4, 2.0)};
  b.kernels = {kernel(90)};
  // The file as the gnsilu of format version 1 wrote it: no "layout", no "activation".
  nlohmann::json doc = nlohmann::json::parse(export_text(b));
  REQUIRE(doc["format_version"] == kExportVersion);
  doc["format_version"] = 1;
  for (auto& e : doc["tuning"]) {
    REQUIRE(e["key"].erase("layout") == 1);
    REQUIRE(e["key"].erase("activation") == 1);
  }
  const std::string v1 = doc.dump(1);
  REQUIRE(v1.find("layout") == std::string::npos);
  const Bundle back = parse_export(v1, "old.json");
  REQUIRE(back.tuning.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(back.tuning[i].key == b.tuning[i].key);
    CHECK(back.tuning[i].key.layout == gnsilu::Layout::ChannelsFirst);
    CHECK(back.tuning[i].key.activation == gnsilu::Activation::SiLU);
    CHECK(back.tuning[i].winner == b.tuning[i].winner);
  }
  REQUIRE(back.kernels.size() == 1);
  // A version 1 file that names them anyway is read the same way, and checked the same way.
  nlohmann::json named = nlohmann::json::parse(export_text(b));
  named["format_version"] = 1;
  named["tuning"][1]["key"]["layout"] = "nhwc";
  CHECK(parse_export(named.dump(), "old.json").tuning[1].key.layout == gnsilu::Layout::ChannelsLast);
  named["tuning"][1]["key"]["layout"] = "nhcw";
  try {
    parse_export(named.dump(), "old.json");
    FAIL("an unknown layout was accepted");
  } catch (const TransferError& e) {
    CHECK(std::string(e.what()).find("old.json: tuning[1].key.layout") != std::string::npos);
  }
  // Merging the old file into entries of today: its entries are the nchw / silu ones.
  Bundle today;
  TuningKey nhwc = key(4);
  nhwc.layout = gnsilu::Layout::ChannelsLast;
  today.tuning = {entry(nhwc, 16, 1.0)};
  const MergeReport r = merge(today, back);
  CHECK(r.added == 2);
  CHECK(r.conflicts.empty());
}

TEST_CASE("what an entry was tuned on is exported typed, and read from its text in files without the typed fields") {
  TuningEntry fused = entry(key(16), 4, 1.0);
  fused.key.size_class = "l2-fused";
  fused.tuned_shape = {{2, 256, 4096}, 8, gnsilu::Path::Fused};
  Bundle b;
  b.tuning = {entry(key(4), 8, 1.0), fused};
  const std::string text = export_text(b);
  nlohmann::json doc = nlohmann::json::parse(text);
  CHECK(doc["format_version"] == 2);
  CHECK(doc["tuning"][0]["tuned_shape"] == "1x512x16384 G=32");  // the display text, as before
  CHECK(doc["tuning"][1]["tuned_shape"] == "2x256x4096 G=8");
  CHECK(doc["tuning"][1]["tuned_dims"] == nlohmann::json::array({2, 256, 4096}));
  CHECK(doc["tuning"][1]["tuned_groups"] == 8);
  CHECK(doc["tuning"][1]["path"] == "fused");
  const Bundle back = parse_export(text, "e.json");
  REQUIRE(back.tuning.size() == 2);
  CHECK(back.tuning[0].tuned_shape == b.tuning[0].tuned_shape);
  CHECK(back.tuning[1].tuned_shape == fused.tuned_shape);
  // Files written before the typed fields (version 1, and version 2 before schema 4): read from "tuned_shape"
  // and the size class.
  for (auto& e : doc["tuning"]) {
    REQUIRE(e.erase("tuned_dims") == 1);
    REQUIRE(e.erase("tuned_groups") == 1);
    REQUIRE(e.erase("path") == 1);
  }
  for (int version : {2, 1}) {
    doc["format_version"] = version;
    const Bundle old = parse_export(doc.dump(), "old.json");
    REQUIRE(old.tuning.size() == 2);
    CHECK(old.tuning[0].tuned_shape == b.tuning[0].tuned_shape);
    CHECK(old.tuning[1].tuned_shape == fused.tuned_shape);
  }
  doc["tuning"][1]["tuned_shape"] = "a shape";
  CHECK(parse_export(doc.dump(), "old.json").tuning[1].tuned_shape == TunedShape{{}, 0, gnsilu::Path::Fused});
  // The typed fields are checked like the others.
  auto message = [&](const nlohmann::json& j) {
    try {
      parse_export(j.dump(), "in.json");
    } catch (const TransferError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  nlohmann::json bad = nlohmann::json::parse(text);
  bad["tuning"][1]["path"] = "sideways";
  CHECK(message(bad).find("in.json: tuning[1].path: \"sideways\"") != std::string::npos);
  bad["tuning"][1].erase("path");
  CHECK(message(bad).find("in.json: tuning[1]: has no \"path\"") != std::string::npos);
  bad = nlohmann::json::parse(text);
  bad["tuning"][1]["tuned_dims"] = nlohmann::json::array({2, 0});
  CHECK(message(bad).find("in.json: tuning[1].tuned_dims") != std::string::npos);
  bad["tuning"][1]["tuned_dims"] = "2x256";
  CHECK(message(bad).find("in.json: tuning[1].tuned_dims: is not an array") != std::string::npos);
  bad = nlohmann::json::parse(text);
  bad["tuning"][1]["tuned_groups"] = "8";
  CHECK(message(bad).find("in.json: tuning[1].tuned_groups") != std::string::npos);
  // Through a store and back.
  TempDir dir("transfer-test");
  Store s(dir.file("c.sqlite"), Store::Mode::ReadWrite);
  CHECK(merge_into(s, back).added == 2);
  CHECK(s.find_tuning(fused.key)->tuned_shape == fused.tuned_shape);
  CHECK(bundle_of(s, false).tuning[0].tuned_shape == b.tuning[0].tuned_shape);
}

TEST_CASE("entries differing only in layout or activation are different keys when merging") {
  TuningKey nhwc = key(4), none = key(4);
  nhwc.layout = gnsilu::Layout::ChannelsLast;
  none.activation = gnsilu::Activation::None;
  Bundle into;
  into.tuning = {entry(key(4), 8, 1.0)};
  Bundle incoming;
  incoming.tuning = {entry(nhwc, 16, 0.5), entry(none, 2, 0.5), entry(key(4), 4, 0.5)};
  const MergeReport r = merge(into, incoming);
  CHECK(r.added == 2);
  CHECK(r.replaced == 1);  // only the nchw / silu entry conflicted
  REQUIRE(r.conflicts.size() == 1);
  CHECK(r.conflicts[0].key == key(4));
  REQUIRE(into.tuning.size() == 3);
  CHECK(into.tuning[0].winner.warps == 4);
  CHECK(into.tuning[1].key == nhwc);
  CHECK(into.tuning[2].key == none);
  // Through a store and back.
  TempDir dir("transfer-test");
  Store s(dir.file("c.sqlite"), Store::Mode::ReadWrite);
  CHECK(merge_into(s, into).added == 3);
  CHECK(s.find_tuning(nhwc)->winner.warps == 16);
  CHECK(s.find_tuning(none)->winner.warps == 2);
  CHECK(s.find_tuning(key(4))->winner.warps == 4);
  CHECK(merge_into(s, into).identical == 3);
}

TEST_CASE("a cache file of an older schema is read without being changed") {
  TempDir dir("transfer-test");
  const std::string path = dir.file("v2.sqlite");
  REQUIRE(Store::create_at_version(path, 2));
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    db.exec("INSERT INTO tuning (device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version, "
            "channels_per_group, x_dtype, y_dtype, size_class, elems_per_load, warps, stages, programs_per_sm, "
            "default_us, best_us, noise_us, tuned_shape, library_version, created_at) VALUES ('NVIDIA H200', 90, 132, "
            "143771, 61440, 'v1', 4, 'bf16', 'bf16', 'dram-split', 16, 8, 1, 4, 300, 250, 1, 's', '0.1.0', 1000)");
    db.exec("PRAGMA journal_mode = DELETE");
  }
  const std::string before = testing::read_bytes(path);
  const Bundle b = read_bundle(path);
  REQUIRE(b.tuning.size() == 1);
  CHECK(b.tuning[0].key == key(4));
  CHECK(b.tuning[0].key.layout == gnsilu::Layout::ChannelsFirst);
  CHECK(b.tuning[0].key.activation == gnsilu::Activation::SiLU);
  CHECK(testing::read_bytes(path) == before);
  CHECK(parse_export(export_text(b), "e.json").tuning[0].key == key(4));
}

TEST_CASE("better measured: more candidates timed, then lower relative noise, then newer") {
  const TuningKey k = key(4);
  CHECK(better_measured(entry(k, 8, 9.0, 5), entry(k, 4, 1.0, 3)));
  CHECK_FALSE(better_measured(entry(k, 8, 1.0, 3), entry(k, 4, 1.0, 5)));
  CHECK(better_measured(entry(k, 8, 1.0), entry(k, 4, 2.0)));
  CHECK(better_measured(entry(k, 8, 1.0, 3, 2000), entry(k, 4, 1.0, 3, 1000)));
  CHECK_FALSE(better_measured(entry(k, 8, 1.0), entry(k, 8, 1.0)));
}

TEST_CASE("merging: new keys added, identical ones counted, conflicts keep the better-measured entry") {
  Bundle into;
  into.tuning = {entry(key(4), 8, 2.0), entry(key(8), 8, 1.0)};
  into.kernels = {kernel(90)};
  Bundle incoming;
  incoming.tuning = {entry(key(4), 16, 1.0),  // better: replaces
                     entry(key(8), 4, 5.0),   // worse: kept out
                     entry(key(16), 2, 1.0),  // new
                     entry(key(4, "NVIDIA H100"), 8, 1.0)};
  incoming.kernels = {kernel(90), kernel(100)};
  const MergeReport r = merge(into, incoming);
  CHECK(r.added == 2);
  CHECK(r.replaced == 1);
  CHECK(r.kept == 1);
  CHECK(r.kernels_added == 1);
  CHECK(r.kernels_identical == 1);
  REQUIRE(r.conflicts.size() == 2);
  CHECK(r.conflicts[0].incoming_kept);
  CHECK(r.conflicts[0].kept.warps == 16);
  CHECK_FALSE(r.conflicts[1].incoming_kept);
  CHECK(into.tuning.size() == 4);
  CHECK(into.tuning[0].winner.warps == 16);
  CHECK(into.tuning[1].winner.warps == 8);
  const MergeReport again = merge(into, incoming);
  CHECK(again.added == 0);
  CHECK(again.conflicts.size() == 1);  // key(8): the incoming entry is still the worse one
  CHECK(again.identical == 3);
}

TEST_CASE("merging into a store writes only what changed; a dry run writes nothing") {
  TempDir dir("transfer-test");
  Store s(dir.file("c.sqlite"), Store::Mode::ReadWrite);
  REQUIRE(s.put_tuning(entry(key(4), 8, 2.0)));
  Bundle incoming;
  incoming.tuning = {entry(key(4), 16, 1.0), entry(key(32), 2, 1.0)};
  incoming.kernels = {kernel(90)};
  const MergeReport dry = merge_into(s, incoming, true);
  CHECK(dry.added == 1);
  CHECK(dry.replaced == 1);
  CHECK(s.all_tuning().size() == 1);
  CHECK(s.kernel_count() == 0);
  merge_into(s, incoming);
  CHECK(s.all_tuning().size() == 2);
  CHECK(s.find_tuning(key(4))->winner.warps == 16);
  CHECK(s.kernel_count() == 1);
  CHECK(merge_into(s, incoming).identical == 2);
}

TEST_CASE("entries for another device or kernel version are set apart") {
  Bundle b;
  b.tuning = {entry(key(4), 8, 1.0), entry(key(4, "NVIDIA H100"), 8, 1.0), entry(key(8, "NVIDIA H200", "v0"), 8, 1.0)};
  b.kernels = {kernel(90), kernel(80), kernel(90, "v0")};
  const DeviceIdentity h200 = key(4).device;
  Bundle copy = b;
  const Bundle out = take_mismatched(copy, h200, "v1");
  CHECK(copy.tuning.size() == 1);
  CHECK(copy.kernels.size() == 1);
  CHECK(out.tuning.size() == 2);
  CHECK(out.kernels.size() == 2);
  Bundle any = b;
  CHECK(take_mismatched(any, std::nullopt, "v1").tuning.size() == 1);  // no device: only the version counts
}

TEST_CASE("kernel listing and removal in a store") {
  TempDir dir("transfer-test");
  Store s(dir.file("c.sqlite"), Store::Mode::ReadWrite);
  REQUIRE(s.put_kernel(kernel(90).key, kernel(90).image));
  REQUIRE(s.put_kernel(kernel(80, "v0").key, kernel(80, "v0").image));
  REQUIRE(s.kernel_keys().size() == 2);
  CHECK(s.remove_kernel(kernel(80, "v0").key));
  REQUIRE(s.kernel_keys().size() == 1);
  CHECK(s.kernel_keys()[0] == kernel(90).key);
}
