// Which cache files may give kernels (files anyone else could write give tuning entries only), and the
// permissions of a new cache file and folder.
#include "cache/cache_support.hpp"

// The library's log lines while it lives.
class CapturedLog {
 public:
  int count(const std::string& text) const {
    int n = 0;
    const std::string all = capture_.text();
    for (auto at = all.find(text); at != std::string::npos; at = all.find(text, at + 1)) ++n;
    return n;
  }

 private:
  gnsilu::detail::LogCapture capture_;
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
