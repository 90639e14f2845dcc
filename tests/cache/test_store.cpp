// The cache store without a GPU: entries and kernels round-trip, every key field separates entries, shapes as
// text, keys no name stands for.
#include "cache/cache_support.hpp"

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
