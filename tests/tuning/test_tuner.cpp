// The tuner's selection logic with an injected backend (no GPU): clear wins, gains within the noise, ties,
// candidates that fail to build or to run, a faster candidate with wrong bits, and the tuning slice.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <stdexcept>
#include <string>

#include "gnsilu/gnsilu.hpp"
#include "runtime/plan.hpp"
#include "tuning/tuner.hpp"

using gnsilu::LaunchConfig;
using namespace gnsilu::detail;

namespace {

// Each configuration has a true time and a noise amplitude; some fail to prepare, to run, or give other bits.
class FakeBackend : public TuneBackend {
 public:
  struct Behaviour {
    double us = 100;
    double noise = 0.5;
    bool prepare_fails = false;
    bool run_fails = false;
    bool wrong = false;
    double after_itself = 0;  // faster by this much when the run before was of the same configuration
  };
  std::map<int, Behaviour> by_warps;  // configurations told apart by their warp count
  std::mt19937 rng{42};
  int prepared = 0, timed = 0, compared = 0;
  int last_warps = 0, repeats = 0;  // the last configuration run; timed runs that followed their own configuration

  void prepare(const LaunchConfig& c) override {
    ++prepared;
    if (by_warps[c.warps].prepare_fails) throw gnsilu::CompileError("fake: does not compile", "log", "opts");
  }
  double time_us(const LaunchConfig& c) override {
    ++timed;
    const Behaviour& b = by_warps[c.warps];
    if (b.run_fails) throw gnsilu::CudaError(719, "fake: launch failed");
    const bool again = c.warps == last_warps;
    last_warps = c.warps;
    if (again) ++repeats;
    std::uniform_real_distribution<double> jitter(-b.noise, b.noise);
    return b.us - (again ? b.after_itself : 0) + jitter(rng);
  }
  bool same_output_as_default(const LaunchConfig& c) override {
    ++compared;
    return !by_warps[c.warps].wrong;
  }
};

const LaunchConfig kDefault{16, 8, 1, 4};
const std::vector<LaunchConfig> kCandidates = {kDefault, {8, 4, 1, 8}, {32, 16, 1, 2}, {16, 2, 2, 8}, {32, 1, 2, 2}};

TuneBudget fast_budget() {
  TuneBudget b;
  b.seconds_per_candidate = 0;
  return b;
}

const gnsilu::cache::CandidateTiming& timing_of(const TuneOutcome& o, int warps) {
  for (const auto& c : o.candidates)
    if (c.config.warps == warps) return c;
  throw std::runtime_error("no such candidate");
}

}  // namespace

TEST_CASE("a clearly faster candidate wins, after its output is checked") {
  FakeBackend fake;
  fake.by_warps[8] = {100, 0.5};
  fake.by_warps[4] = {80, 0.5};
  fake.by_warps[16] = {90, 0.5};
  fake.by_warps[2] = {95, 0.5};
  fake.by_warps[1] = {120, 0.5};
  const TuneOutcome o = select_config(kCandidates, fake, fast_budget());
  CHECK(o.winner == LaunchConfig{8, 4, 1, 8});
  CHECK(o.default_us == doctest::Approx(100).epsilon(0.01));
  CHECK(o.best_us == doctest::Approx(80).epsilon(0.01));
  CHECK(fake.compared == 1);
  CHECK(o.candidates.size() == kCandidates.size());
  for (const auto& c : o.candidates) {
    CHECK(c.status == "ok");
    CHECK(c.samples >= 7);
  }
}

TEST_CASE("the default stays unless a candidate beats it by more than the noise and by 1%") {
  SUBCASE("gain below 1%") {
    FakeBackend fake;
    fake.by_warps[8] = {100, 0.1};
    fake.by_warps[4] = {99.5, 0.1};
    for (int w : {16, 2, 1}) fake.by_warps[w] = {130, 0.1};
    CHECK(select_config(kCandidates, fake, fast_budget()).winner == kDefault);
    CHECK(fake.compared == 0);
  }
  SUBCASE("gain within the measured noise") {
    FakeBackend fake;
    fake.by_warps[8] = {100, 12};
    fake.by_warps[4] = {96, 12};
    for (int w : {16, 2, 1}) fake.by_warps[w] = {130, 1};
    CHECK(select_config(kCandidates, fake, fast_budget()).winner == kDefault);
  }
  SUBCASE("an exact tie") {
    FakeBackend fake;
    for (int w : {8, 4, 16, 2, 1}) fake.by_warps[w] = {100, 0};
    CHECK(select_config(kCandidates, fake, fast_budget()).winner == kDefault);
  }
  SUBCASE("the default is the fastest") {
    FakeBackend fake;
    fake.by_warps[8] = {50, 0.5};
    for (int w : {4, 16, 2, 1}) fake.by_warps[w] = {100, 0.5};
    const TuneOutcome o = select_config(kCandidates, fake, fast_budget());
    CHECK(o.winner == kDefault);
    CHECK(o.best_us == o.default_us);
  }
}

TEST_CASE("candidates that fail to build or to run are skipped and reported; a failing default is an error") {
  FakeBackend fake;
  fake.by_warps[8] = {100, 0.5};
  fake.by_warps[4] = {60, 0.5, true};          // does not compile
  fake.by_warps[16] = {70, 0.5, false, true};  // launch fails
  fake.by_warps[2] = {85, 0.5};
  fake.by_warps[1] = {110, 0.5};
  const TuneOutcome o = select_config(kCandidates, fake, fast_budget());
  CHECK(o.winner == LaunchConfig{16, 2, 2, 8});
  CHECK(timing_of(o, 4).status.find("failed") == 0);
  CHECK(timing_of(o, 4).samples == 0);
  CHECK(timing_of(o, 16).status.find("failed") == 0);
  CHECK(timing_of(o, 2).status == "ok");

  FakeBackend broken;
  broken.by_warps[8] = {100, 0.5, true};
  CHECK_THROWS_AS(select_config(kCandidates, broken, fast_budget()), gnsilu::Error);
}

TEST_CASE("a faster candidate with different bits is rejected; the next one that passes wins") {
  FakeBackend fake;
  fake.by_warps[8] = {100, 0.5};
  fake.by_warps[4] = {50, 0.5, false, false, true};  // fastest, wrong
  fake.by_warps[16] = {70, 0.5};
  fake.by_warps[2] = {90, 0.5};
  fake.by_warps[1] = {120, 0.5};
  const TuneOutcome o = select_config(kCandidates, fake, fast_budget());
  CHECK(o.winner == LaunchConfig{32, 16, 1, 2});
  CHECK(timing_of(o, 4).status == "wrong output");
  CHECK(fake.compared == 2);

  FakeBackend only_wrong;
  only_wrong.by_warps[8] = {100, 0.5};
  only_wrong.by_warps[4] = {50, 0.5, false, false, true};
  for (int w : {16, 2, 1}) only_wrong.by_warps[w] = {150, 0.5};
  CHECK(select_config(kCandidates, only_wrong, fast_budget()).winner == kDefault);
}

TEST_CASE("only the leaders and the default are re-timed") {
  FakeBackend fake;
  fake.by_warps[8] = {100, 0.5};
  fake.by_warps[4] = {80, 0.5};
  fake.by_warps[16] = {81, 0.5};
  fake.by_warps[2] = {82, 0.5};
  fake.by_warps[1] = {200, 0.5};
  TuneBudget budget = fast_budget();
  budget.min_samples = 10;
  budget.max_samples = 10;
  budget.leader_rounds = 20;
  const TuneOutcome o = select_config(kCandidates, fake, budget);
  CHECK(timing_of(o, 1).samples == 10);  // first pass only
  CHECK(timing_of(o, 4).samples == 20);  // leader rounds
  CHECK(timing_of(o, 8).samples == 20);  // the default is always re-timed
}

TEST_CASE("the first pass takes the candidates in turn: one faster only back to back does not crowd out the leaders") {
  // Three candidates run 30 us faster after a run of their own configuration (as on the H200, where a configuration
  // timed back to back ran up to 18% faster than after another one). Timed back to back in the first pass, they
  // would be the three leaders and hide warps 1, the fastest in an application's conditions.
  FakeBackend fake;
  fake.by_warps[8] = {100, 0.5};
  fake.by_warps[1] = {80, 0.5};
  for (int w : {4, 16, 2}) fake.by_warps[w] = {90, 0.5, false, false, false, 30};
  TuneBudget budget = fast_budget();
  budget.warmup = 1;  // (warm-up runs may follow their own configuration)
  const TuneOutcome o = select_config(kCandidates, fake, budget);
  CHECK(o.winner == LaunchConfig{32, 1, 2, 2});
  CHECK(o.best_us == doctest::Approx(80).epsilon(0.01));
  CHECK(fake.repeats == 0);  // no timed run followed its own configuration
  CHECK(timing_of(o, 4).median_us == doctest::Approx(90).epsilon(0.01));
}

TEST_CASE("median and noise") {
  CHECK(median_of({3, 1, 2}) == 2);
  CHECK(median_of({4, 1, 2, 3}) == 2.5);
  CHECK(median_of({}) == 0);
  CHECK(noise_of({5, 5, 5, 5}) == 0);
  CHECK(noise_of({1, 2, 3, 4, 100}) == doctest::Approx(1.4826));
}

TEST_CASE("the tuning slice: whole tensors, whole samples, or the first groups") {
  std::vector<int64_t> shape;
  int64_t groups = 0;
  const std::size_t mib = std::size_t{1} << 20;
  // 1x128x1024x1024 bf16->bf16 is 512 MiB of x and y: the first 16 groups (256 MiB).
  const Geometry big = make_geometry(std::vector<int64_t>{1, 128, 1024, 1024}, 32);
  REQUIRE(tuning_slice(big, 2, 2, 256 * mib, shape, groups));
  CHECK(shape == std::vector<int64_t>{1, 64, 1048576});
  CHECK(groups == 16);
  // Small enough: the whole tensor.
  const Geometry small = make_geometry(std::vector<int64_t>{2, 64, 32, 32}, 32);
  REQUIRE(tuning_slice(small, 2, 2, 256 * mib, shape, groups));
  CHECK(shape == std::vector<int64_t>{2, 64, 1024});
  CHECK(groups == 32);
  // Many samples: whole samples.
  const Geometry batch = make_geometry(std::vector<int64_t>{64, 256, 64, 64}, 32);
  REQUIRE(tuning_slice(batch, 2, 2, 64 * mib, shape, groups));
  CHECK(shape == std::vector<int64_t>{16, 256, 4096});  // 512 groups of 128 KiB
  CHECK(groups == 32);
  // One group larger than the budget: no slice.
  const Geometry huge = make_geometry(std::vector<int64_t>{1, 64, 8192, 8192}, 1);
  CHECK_FALSE(tuning_slice(huge, 4, 4, 256 * mib, shape, groups));
}

TEST_CASE("a tuning's outcome becomes its cache entry in one place, entry_of") {
  FakeBackend fake;
  fake.by_warps[8] = {100, 0.5};
  fake.by_warps[4] = {80, 0.5};
  for (int w : {16, 2, 1}) fake.by_warps[w] = {120, 0.5};
  const TuneOutcome o = select_config(kCandidates, fake, fast_budget());
  gnsilu::cache::TuningKey key;
  key.channels_per_group = 4;
  key.size_class = "dram-split";
  const gnsilu::cache::TunedShape shape{{1, 64, 4096}, 16, gnsilu::Path::Split};
  const gnsilu::cache::TuningEntry e = entry_of(key, o, shape);
  CHECK(e.key.text() == key.text());
  CHECK(e.winner == o.winner);
  CHECK(e.default_us == o.default_us);
  CHECK(e.best_us == o.best_us);
  CHECK(e.noise_us == o.noise_us);
  CHECK(e.candidates.size() == o.candidates.size());
  CHECK(e.tuned_shape == shape);
  CHECK(e.library_version == gnsilu::version());
  CHECK(e.created_at > 0);
}
