// The user and shared cache files: layering (the user file wins, shared files in order, writes to the user
// file), read-only layers, size classes and the settings from the environment.
#include "cache/cache_support.hpp"

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

TEST_CASE("a shared-path list: split at ':', empty entries dropped (the environment's and the C API's)") {
  using V = std::vector<std::string>;
  CHECK(split_path_list("") == V{});
  CHECK(split_path_list(":") == V{});
  CHECK(split_path_list("/a.sqlite") == V{"/a.sqlite"});
  CHECK(split_path_list("::/a.sqlite::/b c.sqlite:") == V{"/a.sqlite", "/b c.sqlite"});
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
