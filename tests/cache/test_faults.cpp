// Files the cache cannot use (corrupt, truncated, other schema, not ours, unwritable, full disk, locked, a kernel
// whose bytes changed): the store never throws, never changes such a file, and says why.
#include "cache/cache_support.hpp"

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
