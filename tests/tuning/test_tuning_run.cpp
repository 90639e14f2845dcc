// Tuning under a lease, on the CPU: a fake backend (TuningHooks) in place of the GPU, a temporary cache file as the
// user cache. A key is tuned once and then found; a live holder of its lease makes warm_key wait and give up; a dead
// holder's lease is taken over at once; an entry stored by the holder while waiting is used; a failing backend
// is Failed and leaves no lease; retune times a cached key again; config_for tunes a key once per process.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache.hpp"
#include "cache/lease.hpp"
#include "cache/store.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/call.hpp"
#include "runtime/plan.hpp"
#include "temp_dir.hpp"
#include "tuning/config_table.hpp"
#include "tuning/tuning_run.hpp"

using gnsilu::LaunchConfig;
using gnsilu::Path;
using gnsilu::cache::LeaseHolder;
using gnsilu::cache::Store;
using namespace gnsilu::detail;
using O = WarmResult::Outcome;

namespace {

DeviceInfo fake_h200() {
  DeviceInfo d;
  d.device = 0;
  d.ordinal = 0;
  d.name = "NVIDIA H200";
  d.uuid = "0123456789abcdef0123456789abcdef";
  d.major = 9;
  d.minor = 0;
  d.sms = 132;
  d.l2_bytes = 50 << 20;
  d.total_memory = std::size_t{143771} << 20;
  return d;
}

// A candidate other than the split path's default, and a second one: what the fake makes fastest.
LaunchConfig other_candidate(int nth) {
  const LaunchConfig def = gnsilu::default_config(Path::Split);
  for (const auto& c : gnsilu::candidate_configs())
    if (!(c == def) && nth-- == 0) return c;
  FAIL("not enough candidates");
  return def;
}

// What the fake backends do and saw; shared with the test, which reads it after the backend is gone.
struct Script {
  LaunchConfig fastest = gnsilu::default_config(Path::Split);  // times 50 us, every other configuration 100 us
  bool prepare_throws = false;
  bool factory_throws = false;
  int made = 0;
  int timed = 0;
  std::vector<int64_t> slice_shape;
  int64_t slice_groups = 0;
};

class FakeBackend final : public TuneBackend {
 public:
  explicit FakeBackend(std::shared_ptr<Script> script) : script_(std::move(script)) {}
  void prepare(const LaunchConfig&) override {
    if (script_->prepare_throws) throw gnsilu::CompileError("fake: does not compile", "log", "opts");
  }
  double time_us(const LaunchConfig& c) override {
    ++script_->timed;
    return c == script_->fastest ? 50.0 : 100.0;
  }
  bool same_output_as_default(const LaunchConfig&) override { return true; }

 private:
  std::shared_ptr<Script> script_;
};

TuningHooks fake_hooks(const std::shared_ptr<Script>& script) {
  TuningHooks h;
  h.backend = [script](const Call& slice, const LaunchConfig&) -> std::unique_ptr<TuneBackend> {
    if (script->factory_throws) throw gnsilu::CudaError(2, "fake: out of device memory");
    ++script->made;
    script->slice_shape.assign(slice.problem.shape.begin(), slice.problem.shape.end());
    script->slice_groups = slice.problem.num_groups;
    return std::make_unique<FakeBackend>(script);
  };
  h.free_memory = [] { return std::size_t{4} << 20; };  // a scratch budget of 1 MiB: the first 16 groups
  h.capturing = [](const Call&) { return false; };
  h.timings.claim_every = std::chrono::milliseconds(50);  // the waits below are short
  h.timings.poll_every = std::chrono::milliseconds(10);
  return h;
}

// A bf16 activation on the fake device whose x is never read (the fake backend does not touch memory).
struct FakeCall {
  DeviceInfo device = fake_h200();
  std::vector<int64_t> shape;
  gnsilu::Problem problem;
  Geometry geometry;
  explicit FakeCall(std::vector<int64_t> dims, int64_t groups = 32) : shape(std::move(dims)) {
    problem.x = reinterpret_cast<const void*>(uintptr_t{0x7f0000000000});
    problem.shape = shape;
    problem.num_groups = groups;
    geometry = make_geometry(shape, groups);
  }
  Call call() const { return Call{problem, geometry, device, nullptr, nullptr, Path::Split}; }
};

// The process's cache is one file in a temporary folder for the test's duration.
struct TempCache {
  testing::TempDir dir{"tuning-run"};
  std::string path = dir.file("cache.sqlite");
  TempCache() { gnsilu::set_cache_paths(path); }
  ~TempCache() { gnsilu::set_cache_paths(""); }
};

WaitOptions waiting_up_to(double seconds, std::vector<std::string>* holders = nullptr) {
  WaitOptions w;
  w.wait_seconds = seconds;
  if (holders != nullptr) w.waiting = [holders](const std::string& holder, double) { holders->push_back(holder); };
  return w;
}

// This process under another thread's name: a live holder that is not this warm_key's.
std::string live_other_holder() {
  LeaseHolder other = LeaseHolder::self();
  other.thread = "another-thread";
  return other.text();
}

// What another process that tuned `key` stores: other_candidate(2) at 70 us.
gnsilu::cache::TuningEntry entry_by_another_process(const gnsilu::cache::TuningKey& key) {
  gnsilu::cache::TuningEntry e;
  e.key = key;
  e.winner = other_candidate(2);
  e.default_us = 100;
  e.best_us = 70;
  e.tuned_shape.dims = {1, 128, 4096};
  e.tuned_shape.groups = 32;
  e.tuned_shape.path = Path::Split;
  e.library_version = gnsilu::version();
  e.created_at = 1;
  return e;
}

}  // namespace

TEST_CASE("a key is tuned once and stored; the next warm finds it") {
  TempCache cache;
  const FakeCall fc({1, 128, 64, 64});
  const Call call = fc.call();
  auto script = std::make_shared<Script>();
  script->fastest = other_candidate(0);
  const TuningHooks hooks = fake_hooks(script);
  const uint64_t tuned_before = counters().tuned.load();

  const WarmResult first = warm_key(call, false, waiting_up_to(5), hooks);
  CHECK(first.outcome == O::Tuned);
  CHECK(first.message.empty());
  REQUIRE(first.entry);
  CHECK(first.entry->winner == script->fastest);
  CHECK(first.entry->default_us == doctest::Approx(100));
  CHECK(first.entry->best_us == doctest::Approx(50));
  CHECK(first.entry->key.text() == tuning_key(call).text());
  CHECK(first.entry->candidates.size() >= gnsilu::candidate_configs().size());
  CHECK(script->made == 1);
  // The tuner timed the slice that fits a quarter of the (fake) free memory: 16 groups of 64 KiB.
  CHECK(script->slice_shape == std::vector<int64_t>{1, 64, 4096});
  CHECK(script->slice_groups == 16);
  CHECK(first.entry->tuned_shape.dims == std::vector<int64_t>{1, 64, 4096});
  CHECK(first.entry->tuned_shape.groups == 16);
  CHECK(first.entry->tuned_shape.path == Path::Split);
  CHECK(counters().tuned.load() == tuned_before + 1);

  Store file(cache.path, Store::Mode::ReadOnly);
  const auto stored = file.find_tuning(first.key);
  REQUIRE(stored);
  CHECK(stored->winner == script->fastest);
  CHECK_FALSE(file.lease(first.key.text()));  // released

  const WarmResult second = warm_key(call, false, waiting_up_to(5), hooks);
  CHECK(second.outcome == O::Cached);
  REQUIRE(second.entry);
  CHECK(second.entry->winner == script->fastest);
  CHECK(script->made == 1);
  // With the key its caller computed (gnsilu-tune keys its rows once): the same entry, nothing timed again.
  const WarmResult keyed = warm_key(call, tuning_key(call), std::nullopt, false, waiting_up_to(5), hooks);
  CHECK(keyed.outcome == O::Cached);
  CHECK(keyed.key.text() == first.key.text());
  REQUIRE(keyed.entry);
  CHECK(keyed.entry->winner == script->fastest);
  CHECK(script->made == 1);
}

TEST_CASE("a slice the caller sized x for is the slice timed; tuning_slice_of gives the free memory's") {
  TempCache cache;
  const FakeCall fc({1, 128, 64, 64});
  const Call call = fc.call();
  auto script = std::make_shared<Script>();
  const TuningHooks hooks = fake_hooks(script);  // its free memory would give 16 groups (the case above)
  const TuningSlice sized = tuning_slice_of(fc.geometry, gnsilu::DType::BF16, gnsilu::DType::BF16, std::size_t{2} << 20);
  CHECK(sized.shape == std::vector<int64_t>{1, 32, 4096});  // a quarter of 2 MiB: 8 groups of 64 KiB
  CHECK(sized.groups == 8);
  CHECK_THROWS_AS(tuning_slice_of(fc.geometry, gnsilu::DType::BF16, gnsilu::DType::BF16, 0), gnsilu::Error);

  const WarmResult r = warm_key(call, tuning_key(call), sized, false, waiting_up_to(5), hooks);
  CHECK(r.outcome == O::Tuned);
  CHECK(script->slice_shape == sized.shape);
  CHECK(script->slice_groups == 8);
  REQUIRE(r.entry);
  CHECK(r.entry->tuned_shape.dims == sized.shape);
  CHECK(r.entry->tuned_shape.groups == 8);
}

TEST_CASE("find_or_tune without leave to tune: the cache files' entry, else NotFound, and nothing is timed") {
  TempCache cache;
  const FakeCall fc({1, 128, 64, 64});
  const Call call = fc.call();
  auto script = std::make_shared<Script>();
  const TuningHooks hooks = fake_hooks(script);
  auto store = gnsilu::cache::process_cache();
  EntryRequest request{call, tuning_key(call)};
  request.may_tune = false;
  const WarmResult missing = find_or_tune(request, *store, waiting_up_to(5), hooks);
  CHECK(missing.outcome == O::NotFound);
  CHECK_FALSE(missing.entry);
  CHECK(missing.key.text() == request.key.text());
  CHECK(script->made == 0);

  request.may_tune = true;
  REQUIRE(find_or_tune(request, *store, waiting_up_to(5), hooks).outcome == O::Tuned);
  request.may_tune = false;
  const WarmResult found = find_or_tune(request, *store, waiting_up_to(5), hooks);
  CHECK(found.outcome == O::Cached);
  CHECK(found.entry);
  CHECK(script->made == 1);
}

TEST_CASE("retune times a cached key again and replaces its entry") {
  TempCache cache;
  const FakeCall fc({1, 128, 64, 64});
  const Call call = fc.call();
  auto script = std::make_shared<Script>();
  script->fastest = other_candidate(0);
  const TuningHooks hooks = fake_hooks(script);
  REQUIRE(warm_key(call, false, waiting_up_to(5), hooks).outcome == O::Tuned);

  script->fastest = other_candidate(1);  // the device "changed its mind"
  const WarmResult cached = warm_key(call, false, waiting_up_to(5), hooks);
  CHECK(cached.outcome == O::Cached);
  CHECK(cached.entry->winner == other_candidate(0));
  const int timed = script->timed;

  const WarmResult retuned = warm_key(call, true, waiting_up_to(5), hooks);
  CHECK(retuned.outcome == O::Tuned);
  REQUIRE(retuned.entry);
  CHECK(retuned.entry->winner == other_candidate(1));
  CHECK(script->made == 2);
  CHECK(script->timed > timed);
  const WarmResult after = warm_key(call, false, waiting_up_to(5), hooks);
  CHECK(after.outcome == O::Cached);
  CHECK(after.entry->winner == other_candidate(1));
}

TEST_CASE("a live holder of the lease makes warm_key wait, report the holder, and give up") {
  TempCache cache;
  const FakeCall fc({1, 128, 64, 64});
  const Call call = fc.call();
  auto script = std::make_shared<Script>();
  const TuningHooks hooks = fake_hooks(script);
  const std::string lease = tuning_key(call).text();
  Store file(cache.path, Store::Mode::ReadWrite);
  const std::string holder = live_other_holder();
  REQUIRE(file.claim(lease, holder, 60) == Store::Claim::Acquired);
  const uint64_t waited_before = counters().waited_for_other_process.load();

  // Patience of 2 s: it gives up no sooner (the clock only moves forward, so that bound cannot fail by load), and
  // reports the holder at least at its first claim, which comes at once (2 s of headroom even for a loaded
  // machine). How many times it claims again in those 2 s depends on the machine and is not asserted.
  std::vector<std::string> holders;
  const WarmResult r = warm_key(call, false, waiting_up_to(2.0, &holders), hooks);
  CHECK(r.outcome == O::HeldByOther);
  CHECK_FALSE(r.entry);
  CHECK(r.seconds >= 1.99);
  const std::string me = "pid " + std::to_string(getpid()) + " on ";
  CHECK(r.message.find(me) != std::string::npos);
  REQUIRE(!holders.empty());
  for (const auto& h : holders) CHECK(h.find(me) == 0);
  CHECK(script->made == 0);
  CHECK(counters().waited_for_other_process.load() == waited_before + 1);
  REQUIRE(file.lease(lease));
  CHECK(file.lease(lease)->owner == holder);  // still theirs
}

TEST_CASE("the lease of a dead holder on this host is taken over at once and the key tuned") {
  TempCache cache;
  const FakeCall fc({1, 128, 64, 64});
  const Call call = fc.call();
  const std::string lease = tuning_key(call).text();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    Store s(cache.path, Store::Mode::ReadWrite);
    const bool ok = s.claim(lease, LeaseHolder::self().text(), 3600) == Store::Claim::Acquired;
    _exit(ok ? 0 : 1);  // dies holding an hour-long lease
  }
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  {
    Store file(cache.path, Store::Mode::ReadOnly);
    REQUIRE(file.lease(lease));
    REQUIRE(LeaseHolder::parse(file.lease(lease)->owner));
    CHECK(LeaseHolder::parse(file.lease(lease)->owner)->pid == child);
  }

  auto script = std::make_shared<Script>();
  const TuningHooks hooks = fake_hooks(script);
  const uint64_t waited_before = counters().waited_for_other_process.load();
  std::vector<std::string> holders;
  const WarmResult r = warm_key(call, false, waiting_up_to(30, &holders), hooks);
  CHECK(r.outcome == O::Tuned);
  CHECK(holders.empty());  // taken over by the first claim: no wait
  CHECK(counters().waited_for_other_process.load() == waited_before);
  CHECK(script->made == 1);
  Store file(cache.path, Store::Mode::ReadOnly);
  CHECK(file.find_tuning(r.key));
  CHECK_FALSE(file.lease(lease));
}

TEST_CASE("an entry stored by the lease's holder while warm_key waits is used: TunedElsewhere") {
  TempCache cache;
  const FakeCall fc({1, 128, 64, 64});
  const Call call = fc.call();
  auto script = std::make_shared<Script>();
  const TuningHooks hooks = fake_hooks(script);
  const gnsilu::cache::TuningKey key = tuning_key(call);
  Store file(cache.path, Store::Mode::ReadWrite);
  const std::string holder = live_other_holder();
  REQUIRE(file.claim(key.text(), holder, 60) == Store::Claim::Acquired);

  const gnsilu::cache::TuningEntry theirs = entry_by_another_process(key);
  int calls = 0;
  WaitOptions wait = waiting_up_to(30);
  wait.waiting = [&](const std::string&, double) {
    if (++calls == 2) REQUIRE(file.put_tuning(theirs));  // the holder finishes while this process waits
  };
  const WarmResult r = warm_key(call, false, wait, hooks);
  CHECK(r.outcome == O::TunedElsewhere);
  REQUIRE(r.entry);
  CHECK(r.entry->winner == other_candidate(2));
  CHECK(r.entry->best_us == doctest::Approx(70));
  CHECK(calls == 2);
  CHECK(script->made == 0);
  CHECK(file.lease(key.text())->owner == holder);  // not this process's to release
}

TEST_CASE("retune while another process holds the lease waits for that process's new entry, not the old one") {
  TempCache cache;
  const FakeCall fc({1, 128, 64, 64});
  const Call call = fc.call();
  auto script = std::make_shared<Script>();
  script->fastest = other_candidate(0);
  const TuningHooks hooks = fake_hooks(script);
  const WarmResult mine = warm_key(call, false, waiting_up_to(5), hooks);
  REQUIRE(mine.outcome == O::Tuned);
  Store file(cache.path, Store::Mode::ReadWrite);
  const std::string holder = live_other_holder();
  REQUIRE(file.claim(mine.key.text(), holder, 60) == Store::Claim::Acquired);

  int calls = 0;
  WaitOptions wait = waiting_up_to(30);
  wait.waiting = [&](const std::string&, double) {
    if (++calls == 2) REQUIRE(file.put_tuning(entry_by_another_process(mine.key)));
  };
  const WarmResult r = warm_key(call, true, wait, hooks);
  CHECK(r.outcome == O::TunedElsewhere);
  REQUIRE(r.entry);
  CHECK(r.entry->winner == other_candidate(2));
  CHECK(calls == 2);
  CHECK(script->made == 1);
}

TEST_CASE("a failing tuning is Failed with its message and leaves no lease and no entry") {
  TempCache cache;
  const FakeCall fc({1, 128, 64, 64});
  const Call call = fc.call();
  auto script = std::make_shared<Script>();
  const TuningHooks hooks = fake_hooks(script);
  const std::string lease = tuning_key(call).text();

  SUBCASE("the default does not compile") {
    script->prepare_throws = true;
    const WarmResult r = warm_key(call, false, waiting_up_to(5), hooks);
    CHECK(r.outcome == O::Failed);
    CHECK(r.message.find("fake: does not compile") != std::string::npos);
    CHECK_FALSE(r.entry);
    CHECK(script->made == 1);
  }
  SUBCASE("the backend cannot be made") {
    script->factory_throws = true;
    const WarmResult r = warm_key(call, false, waiting_up_to(5), hooks);
    CHECK(r.outcome == O::Failed);
    CHECK(r.message.find("fake: out of device memory") != std::string::npos);
    CHECK(script->made == 0);
  }
  SUBCASE("not one group fits the scratch budget") {
    TuningHooks no_memory = hooks;
    no_memory.free_memory = [] { return std::size_t{0}; };
    const WarmResult r = warm_key(call, false, waiting_up_to(5), no_memory);
    CHECK(r.outcome == O::Failed);
    CHECK(r.message.find("scratch memory") != std::string::npos);
    CHECK(script->made == 0);
  }
  Store file(cache.path, Store::Mode::ReadOnly);
  CHECK_FALSE(file.lease(lease));
  CHECK_FALSE(file.find_tuning(tuning_key(call)));

  // Nothing is left in the way: the next warm tunes.
  script->prepare_throws = false;
  script->factory_throws = false;
  CHECK(warm_key(call, false, waiting_up_to(5), hooks).outcome == O::Tuned);
}

TEST_CASE("config_for with a fake backend: tuned on first use, then from memory, then from the cache file") {
  TempCache cache;
  clear_config_table();
  const FakeCall fc({1, 128, 128, 128});  // 8 MiB of x and y: GNSILU_TUNE_MIN_BYTES' default
  REQUIRE(activation_bytes(fc.call()) >= min_tune_bytes());
  const Call call = fc.call();
  auto script = std::make_shared<Script>();
  script->fastest = other_candidate(0);
  const TuningHooks hooks = fake_hooks(script);
  const LaunchConfig def = gnsilu::default_config(Path::Split);

  CHECK(config_for(call, gnsilu::TunePolicy::OnFirstUse, hooks) == script->fastest);
  CHECK(script->made == 1);
  CHECK(config_for(call, gnsilu::TunePolicy::OnFirstUse, hooks) == script->fastest);  // the table
  CHECK(script->made == 1);
  clear_config_table();
  const uint64_t found_before = counters().found_in_cache.load();
  CHECK(config_for(call, gnsilu::TunePolicy::OnFirstUse, hooks) == script->fastest);  // the file
  CHECK(script->made == 1);
  CHECK(counters().found_in_cache.load() == found_before + 1);

  // Another key: not tuned under CachedOnly, nor while the stream captures a graph (and not remembered).
  const FakeCall wide({1, 256, 64, 128});
  const Call other = wide.call();
  CHECK(config_for(other, gnsilu::TunePolicy::CachedOnly, hooks) == def);
  TuningHooks capturing = hooks;
  capturing.capturing = [](const Call&) { return true; };
  CHECK(config_for(other, gnsilu::TunePolicy::OnFirstUse, capturing) == def);
  CHECK(script->made == 1);
  CHECK(config_for(other, gnsilu::TunePolicy::OnFirstUse, hooks) == script->fastest);
  CHECK(script->made == 2);
  clear_config_table();
}

TEST_CASE("GNSILU_TUNE_WAIT_MS: how long a first use waits for another process, 3 s by default") {
  unsetenv("GNSILU_TUNE_WAIT_MS");
  CHECK(first_use_wait_seconds() == doctest::Approx(kLeaseTimings.first_use_wait.count()));
  CHECK(kLeaseTimings.first_use_wait.count() == doctest::Approx(3.0));
  setenv("GNSILU_TUNE_WAIT_MS", "250", 1);
  CHECK(first_use_wait_seconds() == doctest::Approx(0.25));
  setenv("GNSILU_TUNE_WAIT_MS", "soon", 1);
  CHECK(first_use_wait_seconds() == doctest::Approx(3.0));
  unsetenv("GNSILU_TUNE_WAIT_MS");
  CHECK(WaitOptions{}.wait_seconds == doctest::Approx(600));
}
