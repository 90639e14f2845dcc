// Leases: one owner at a time, holders' identity and liveness, takeover of dead or silent holders, heartbeats,
// processes killed with SIGKILL mid-write, and eight processes on one file.
#include "cache/cache_support.hpp"

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
