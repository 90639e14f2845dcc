// The compile guard (tests/kernels/compile_guard.hpp says how it works): every kernel instantiation the library can
// launch (9 dtype pairs x every candidate configuration x both layouts x both activations, each distinct
// instantiation once) compiles with NVRTC with no stack frame and no register spills (ptxas' report), for one
// architecture of every ptxas class. NVRTC needs no GPU, so this runs in CI.
//
// The environment:
// - GNSILU_TEST_ARCHS: unset, one architecture per ptxas class; "all", every one from sm_75 up, each sibling's
//   reports equal to its representative's (tools/compile_all_archs.sh); a list ("90,100"), those.
// - GNSILU_COMPILE_RECORD: the committed record (default tests/kernels/compile_record.txt of this source tree; "none"
//   for no record). Where its identity (rules, kernel sources, NVRTC library, options) and a job's kernel names are
//   the tree's, the job's reports come from it; GNSILU_COMPILE_SAMPLE of those jobs (default: one an architecture and
//   4 more; "all": every one) chosen at random (GNSILU_COMPILE_SAMPLE_SEED to repeat a choice; the seed is printed)
//   are compiled here, and any difference from the record fails the test. Every other job is compiled.
// - GNSILU_COMPILE_RECORD_WRITE=<file> (tools/compile_all_archs.sh): with GNSILU_TEST_ARCHS=all, write the record of
//   this run there when every job passed. Such a run reads no record: each job is compiled or remembered.
// - GNSILU_COMPILE_PASS_CACHE=<folder> (.ci/run sets it): a job that compiled and passed here is remembered there and
//   not compiled again (its key: the identity, the architecture and its kernel names, byte for byte).
// - GNSILU_TEST_KERNELS=<substrings, separated by spaces or ';'>: only the kernels whose name expression contains one
//   ("fused<1,1,16,32,1,0> chunk_stats<3,"), under the same rules, nothing read or remembered: a check of chosen
//   instances on every class in minutes.
// - GNSILU_COMPILE_PROFILE=1: each compiled job is also compiled to PTX alone first, and both times are printed: where
//   a compile's time goes (NVRTC's front end, or ptxas: the difference).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "cache/transfer/atomic_file.hpp"
#include "kernels/compile_guard.hpp"
#include "kernels/sha256.hpp"
#include "runtime/compiler.hpp"
#include "runtime/kernel_sources.hpp"
#include "runtime/kernels.hpp"
#include "temp_dir.hpp"

namespace {

using namespace gnsilu::test::compile_guard;
using gnsilu::Activation;
using gnsilu::DType;
using gnsilu::Layout;

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// GNSILU_COMPILE_SAMPLE: a count of jobs (at least 1), or "all"; unset: one an architecture and 4 more.
std::optional<std::size_t> sample_size(const std::string& value, std::size_t archs, std::string* error) {
  if (value.empty()) return archs + 4;
  if (value == "all") return std::numeric_limits<std::size_t>::max();
  if (value.size() > 6 || value.find_first_not_of("0123456789") != std::string::npos || std::stoul(value) == 0) {
    *error = "GNSILU_COMPILE_SAMPLE=" + value +
             ": a number of jobs from 1 (a record is never taken without compiling some of it), or 'all'";
    return std::nullopt;
  }
  return std::stoul(value);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("every kernel instantiation compiles without spills for the architectures under test") {
  const Selection selection = select_archs(std::getenv("GNSILU_TEST_ARCHS"), gnsilu::detail::supported_archs());
  REQUIRE_MESSAGE(selection.error.empty(), selection.error);
  REQUIRE_FALSE(selection.archs.empty());
  MESSAGE(selection.note);
  const std::vector<std::string> filter = kernel_filter(std::getenv("GNSILU_TEST_KERNELS"));
  const std::string write_path = env("GNSILU_COMPILE_RECORD_WRITE");
  REQUIRE_MESSAGE((write_path.empty() || (selection.all && filter.empty())),
                  "GNSILU_COMPILE_RECORD_WRITE needs GNSILU_TEST_ARCHS=all and no GNSILU_TEST_KERNELS");
  std::string error;
  const auto sample = sample_size(env("GNSILU_COMPILE_SAMPLE"), selection.archs.size(), &error);
  REQUIRE_MESSAGE(sample, error);
  const std::string id = identity();

  RunOptions options;
  options.pass_cache = env("GNSILU_COMPILE_PASS_CACHE");
  options.filtered = !filter.empty();
  options.threads = std::max(1u, std::thread::hardware_concurrency());
  options.sample = *sample;
  const std::string seed_text = env("GNSILU_COMPILE_SAMPLE_SEED");
  options.seed = seed_text.empty() ? (std::uint64_t{std::random_device{}()} << 32 | std::random_device{}())
                                   : std::stoull(seed_text);
  options.profile = env("GNSILU_COMPILE_PROFILE") == "1";
  if (options.filtered)
    MESSAGE("GNSILU_TEST_KERNELS=" << env("GNSILU_TEST_KERNELS") << ": filtered, nothing remembered");

  // The record: read unless this run writes one or is filtered.
  std::optional<Record> record;
  std::string record_path = env("GNSILU_COMPILE_RECORD");
  if (std::getenv("GNSILU_COMPILE_RECORD") == nullptr) record_path = GNSILU_COMPILE_RECORD_DEFAULT;
  if (record_path == "none" || record_path.empty() || !write_path.empty() || options.filtered) {
    MESSAGE("no record read" << std::string(write_path.empty() ? "" : " (this run writes one)"));
  } else if (auto r = read_record(record_path, &error)) {
    if (auto why = identity_difference(r->identity, id)) {
      MESSAGE("the record " << record_path << " is not this tree's (" << *why
                            << "): every job is compiled (remake it: bash tools/compile_all_archs.sh)");
    } else {
      record = std::move(r);
      options.record = &*record;
    }
  } else {
    MESSAGE("no record: " << error);
  }

  std::vector<Job> jobs;
  for (int arch : selection.archs) {
    for (Job job : jobs_of(arch)) {
      job.names = filtered_names(job, filter);
      if (!job.names.empty()) jobs.push_back(std::move(job));
    }
  }
  REQUIRE_MESSAGE(!jobs.empty(), "no kernel matches GNSILU_TEST_KERNELS");
  const auto started = std::chrono::steady_clock::now();
  const std::vector<Outcome> outcomes = run_jobs(jobs, id, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  std::size_t failures = 0;  // the record is written only when there are none
  std::map<int, Summary> by_arch;
  std::map<Outcome::Source, std::size_t> counts;
  std::size_t kernels = 0, unequal = 0;  // unequal: jobs compiled again whose reports differ from the record's
  double compile_seconds = 0, front_end_seconds = 0;  // summed over the compiled jobs
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const Outcome& o = outcomes[i];
    failures += o.problems.size() + (o.error.empty() ? 0 : 1);
    if (!o.error.empty()) {
      FAIL_CHECK(jobs[i].label() << ": " << o.error);
      continue;
    }
    counts[o.source]++;
    kernels += o.summary.size();
    const bool differs = std::any_of(o.problems.begin(), o.problems.end(),
                                     [](const std::string& p) { return p.rfind("differs from the record", 0) == 0; });
    unequal += differs ? 1 : 0;
    if (o.source == Outcome::Source::Compiled || o.source == Outcome::Source::Verified) {
      int most = 0;
      for (const auto& [name, k] : o.summary) most = std::max(most, k.registers);
      std::string front_end;
      if (options.profile) front_end = " (front end alone " + std::to_string(o.front_end_seconds) + " s)";
      compile_seconds += o.seconds;
      front_end_seconds += o.front_end_seconds;
      MESSAGE(jobs[i].label() << ": " << o.summary.size() << " kernels, at most " << most << " registers, " << o.seconds
                              << " s" << front_end << ", " << std::string(source_name(o.source))
                              << std::string(o.source != Outcome::Source::Verified ? ""
                                             : differs                             ? ": NOT equal"
                                                                                   : ": equal"));
    }
    if (!o.cache_note.empty()) MESSAGE("pass not remembered: " << o.cache_note);
    for (const auto& p : o.problems)
      FAIL_CHECK(jobs[i].label() << " (" << std::string(source_name(o.source)) << ") " << p);
    by_arch[jobs[i].arch].insert(o.summary.begin(), o.summary.end());
  }
  using S = Outcome::Source;
  MESSAGE(jobs.size() << " jobs (" << kernels << " kernels) on " << options.threads << " threads in " << seconds
                      << " s: " << counts[S::Compiled] << " compiled, " << counts[S::Remembered]
                      << " remembered (GNSILU_COMPILE_PASS_CACHE="
                      << (options.pass_cache.empty() ? "unset" : options.pass_cache) << "), "
                      << counts[S::Recorded] + counts[S::Verified] << " from the record, " << counts[S::Verified]
                      << " of them compiled again (" << unequal << " not equal; seed " << options.seed << "); "
                      << compile_seconds << " s of compiles"
                      << (options.profile ? ", front ends alone " + std::to_string(front_end_seconds) + " s" : ""));
  if (record && counts[S::Recorded] + counts[S::Verified] > 0)
    CHECK_MESSAGE(counts[S::Verified] > 0, "jobs were taken from the record without compiling any of them");

  // Siblings against their representative, where both were compiled.
  for (const auto& c : arch_classes()) {
    if (by_arch.count(c.representative) == 0) continue;
    const Summary& rep = by_arch[c.representative];
    for (int sibling : c.siblings) {
      if (by_arch.count(sibling) == 0) continue;
      const auto diff = differences(rep, by_arch[sibling]);
      failures += diff.size();
      MESSAGE("sm_" << sibling << " against its class's sm_" << c.representative << ": " << diff.size() << " of "
                    << rep.size() << " kernels differ");
      for (std::size_t i = 0; i < std::min<std::size_t>(diff.size(), 20); ++i) FAIL_CHECK(diff[i]);
      CHECK_MESSAGE(diff.empty(), "sm_" << sibling << " is not in sm_" << c.representative
                                        << "'s ptxas class: change arch_classes() in tests/kernels/compile_guard.cpp");
    }
  }

  if (!write_path.empty()) {
    std::vector<Summary> summaries;
    for (const auto& o : outcomes) summaries.push_back(o.summary);
    if (failures == 0) {
      const auto problem =
          gnsilu::detail::write_file_atomically(write_path, record_text(id, selection.archs, jobs, summaries));
      CHECK_MESSAGE(!problem, "the record " << write_path << " " << problem.value_or(""));
      if (!problem) MESSAGE("the record of " << jobs.size() << " jobs is written to " << write_path);
    } else {
      MESSAGE("no record written: a job failed");
    }
  }
}

TEST_CASE("GNSILU_TEST_ARCHS: the classes' representatives by default, 'all', a list; a wrong entry is an error") {
  const std::vector<int> offered = {52, 75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
  Selection s = select_archs(nullptr, offered);
  CHECK(s.error.empty());
  CHECK_FALSE(s.all);
  CHECK(s.archs == std::vector<int>{75, 80, 86, 90, 100, 103, 110, 120});
  CHECK(select_archs("", offered).archs == s.archs);
  s = select_archs("all", offered);
  CHECK(s.all);
  CHECK(s.archs == std::vector<int>{75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121});
  s = select_archs("100,90,90", offered);
  CHECK(s.error.empty());
  CHECK(s.archs == std::vector<int>{90, 100});
  for (const char* wrong : {"70", "52", "abc", "90,95", "sm_90", ",", "90,", "123456"}) {
    s = select_archs(wrong, offered);
    CHECK_MESSAGE(!s.error.empty(), wrong);
    CHECK(s.archs.empty());
    CHECK(s.error.find("GNSILU_TEST_ARCHS") != std::string::npos);
  }
  // An architecture that no class names is compiled as its own class; a class whose representative this NVRTC
  // lacks is left out.
  s = select_archs(nullptr, {75, 80, 86, 89, 90, 130});
  CHECK(s.archs == std::vector<int>{75, 80, 86, 90, 130});
  CHECK(s.note.find("sm_130 is in no class") != std::string::npos);
  CHECK_FALSE(select_archs(nullptr, {52, 70}).error.empty());
  // Every class is disjoint from every other.
  std::set<int> seen;
  for (const auto& c : arch_classes()) {
    CHECK(seen.insert(c.representative).second);
    for (int a : c.siblings) CHECK(seen.insert(a).second);
  }
}

TEST_CASE("the jobs hold every kernel of every variant, each distinct instantiation in exactly one job") {
  const std::vector<Job> jobs = jobs_of(90);
  std::set<std::string> wanted;
  std::size_t per_variant = 0;
  for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast})
    for (Activation activation : {Activation::SiLU, Activation::None})
      for (DType x : {DType::BF16, DType::FP16, DType::FP32})
        for (DType y : {DType::BF16, DType::FP16, DType::FP32})
          for (const auto& c : gnsilu::candidate_configs())
            for (const auto& name : gnsilu::detail::kernel_names({x, y, c, layout, activation})) {
              ++per_variant;
              wanted.insert(name.substr(std::string("gnsilu::kernel::").size()));
            }
  std::set<std::string> held, labels;
  std::size_t total = 0;
  for (const Job& job : jobs) {
    CHECK(job.arch == 90);
    CHECK(labels.insert(job.label()).second);
    for (const auto& name : job.names) {
      ++total;
      CHECK_MESSAGE(held.insert(name).second, name << " is in two jobs");
      CHECK(job.fused == (name.rfind("fused<", 0) == 0));
    }
  }
  CHECK(held == wanted);
  CHECK(total == wanted.size());
  CHECK(total < per_variant);  // shared instances (chunk_stats, finalize) once, not once a variant
  // The statistics kernels, which do not depend on the activation, are in the SiLU jobs.
  for (const Job& job : jobs) {
    for (const auto& name : job.names) {
      if (name.rfind("chunk_stats<", 0) == 0 || name.rfind("finalize<", 0) == 0)
        CHECK(job.activation == Activation::SiLU);
    }
  }
  CHECK(jobs_of(100).size() == jobs.size());
  CHECK(jobs.front().label() == "sm_90 nchw bf16 silu split");
}

TEST_CASE("GNSILU_TEST_KERNELS: substrings of the kernels' name expressions; a job keeps the names that contain one") {
  CHECK(kernel_filter(nullptr).empty());
  CHECK(kernel_filter("").empty());
  CHECK(kernel_filter(" ;; ").empty());
  CHECK(kernel_filter("fused<1,1,16,32,1,0> apply<").size() == 2);  // commas belong to the template arguments
  CHECK(kernel_filter("finalize;apply_padded").size() == 2);
  CHECK(kernel_filter("gnsilu::kernel::finalize<1,0>") == std::vector<std::string>{"finalize<1,0>"});
  std::vector<std::string> finalize, all;
  for (const Job& job : jobs_of(90)) {
    for (const auto& n : filtered_names(job, {"finalize<"})) finalize.push_back(n);
    for (const auto& n : filtered_names(job, {})) all.push_back(n);
    CHECK(filtered_names(job, {"no such kernel"}).empty());
  }
  CHECK(finalize.size() == 6);  // one a dtype of x and a layout
  CHECK(all.size() > finalize.size());
}

TEST_CASE("keys name what a verdict depends on, and the pass cache reads a pass back only under its key") {
  testing::TempDir dir("compile-pass");
  const std::string folder = dir.file("passes");
  const std::string id = identity();
  CHECK(id.find(gnsilu::detail::kKernelSourceHash) != std::string::npos);
  CHECK(id.find("nvrtc " + gnsilu::detail::nvrtc_version()) != std::string::npos);
  CHECK(id.find(" sha256 ") != std::string::npos);
  CHECK(id.find("unreadable") == std::string::npos);
  CHECK(id.find("--fmad=false") != std::string::npos);
  CHECK(id.find(kRules) != std::string::npos);
  CHECK(id.find("--gpu-architecture") == std::string::npos);
  const std::vector<Job> jobs = jobs_of(90);
  const Job& job = jobs.at(3);
  const std::string key = job_key(id, job);
  CHECK(key.find("--gpu-architecture=sm_90") != std::string::npos);
  for (const auto& name : job.names) CHECK(key.find(" " + name) != std::string::npos);
  std::set<std::string> keys;
  for (const auto& j : jobs) CHECK(keys.insert(job_key(id, j)).second);
  for (const auto& j : jobs_of(100)) CHECK(keys.insert(job_key(id, j)).second);

  CHECK_FALSE(remembered(folder, key));  // nothing yet (and no folder)
  const Summary summary = {{job.names[0], {40, 0, 0, 0}}, {job.names[1], {255, 0, 0, 0}}};
  REQUIRE_FALSE(remember(folder, key, summary));
  const auto back = remembered(folder, key);
  REQUIRE(back);
  CHECK(*back == summary);
  CHECK_FALSE(remembered(folder, job_key(id, jobs.at(4))));

  // The same file name under another key (a hash collision, or a file edited by hand): ignored.
  const std::string path = pass_file(folder, key);
  const std::string text = read_file(path);
  auto rewrite = [&](const std::string& contents) { std::ofstream(path, std::ios::trunc) << contents; };
  std::string other = text;
  other.replace(other.find("sm_90\n"), 6, "sm_91\n");
  rewrite(other);
  CHECK_FALSE(remembered(folder, key));
  rewrite(text.substr(0, text.size() - 5));  // cut inside the summary
  CHECK_FALSE(remembered(folder, key));
  rewrite(key + "---\n");  // no kernels
  CHECK_FALSE(remembered(folder, key));
  rewrite(text);
  CHECK(remembered(folder, key));
}

TEST_CASE("the record: read back as written, found only for a job with the same names, damage named") {
  testing::TempDir dir("compile-record");
  const std::string id = "rules x\nsources sha256 abc\nnvrtc 13.0, libnvrtc.so.13 sha256 def\noptions --fmad=false\n";
  std::vector<Job> jobs = jobs_of(75);
  jobs.resize(2);
  std::vector<Summary> summaries;
  for (const Job& job : jobs) {
    Summary s;
    int r = 30;
    for (const auto& name : job.names) s[name] = {r++, 0, 0, 0};
    summaries.push_back(s);
  }
  const std::string path = dir.file("record.txt");
  std::ofstream(path) << record_text(id, {75, 80}, jobs, summaries);
  std::string error;
  const auto record = read_record(path, &error);
  REQUIRE_MESSAGE(record, error);
  CHECK(record->identity == id);
  CHECK(record->archs == std::vector<int>{75, 80});
  REQUIRE(record->jobs.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    const Summary* s = record->find(jobs[i]);
    REQUIRE(s != nullptr);
    CHECK(*s == summaries[i]);
    CHECK(record->jobs[i].names == jobs[i].names);
  }
  Job fewer = jobs[0];
  fewer.names.pop_back();  // a job whose kernels changed (a candidate configuration more or less)
  CHECK(record->find(fewer) == nullptr);
  Job elsewhere = jobs[0];
  elsewhere.arch = 80;
  CHECK(record->find(elsewhere) == nullptr);
  CHECK(record->find(jobs_of(75).at(2)) == nullptr);  // not recorded

  CHECK_FALSE(identity_difference(record->identity, id));
  const auto why = identity_difference(record->identity, "rules x\nsources sha256 abd\n");
  REQUIRE(why);
  CHECK(why->find("recorded 'sources sha256 abc', this tree 'sources sha256 abd'") != std::string::npos);

  auto damaged = [&](const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
    std::string e;
    CHECK_FALSE(read_record(path, &e));
    CHECK(!e.empty());
    return e;
  };
  CHECK(damaged("identity\nrules x\n").find("no identity block") != std::string::npos);
  CHECK(damaged("job sm_75 x\n").find("expected 'identity'") != std::string::npos);
  CHECK(damaged("identity\nend identity\njob sm_75 x\napply<1> 40 0 0\n").find(":4: not a record line") !=
        std::string::npos);
  CHECK(damaged("identity\nend identity\njob sm_75 x\napply<1> 40 0 0 0\napply<1> 40 0 0 0\n").find("twice") !=
        std::string::npos);
  CHECK(damaged("identity\nend identity\njob sm_x\n").find("without an architecture") != std::string::npos);
  CHECK(read_record(dir.file("missing"), &error) == std::nullopt);
  CHECK(error.find("cannot be read") != std::string::npos);
}

TEST_CASE("the sample: one job an architecture at least, then at random up to the count; the same for the same seed") {
  std::vector<Job> jobs;
  for (int arch : {75, 90, 100})
    for (const Job& j : jobs_of(arch)) jobs.push_back(j);
  for (std::uint64_t seed : {1u, 2u, 3u, 99u}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{7}}) {
      const auto chosen = choose_sample(jobs, count, seed);
      CHECK(chosen.size() == std::max<std::size_t>(count, 3));
      std::set<int> archs;
      std::set<std::size_t> distinct(chosen.begin(), chosen.end());
      CHECK(distinct.size() == chosen.size());
      for (std::size_t i : chosen) archs.insert(jobs.at(i).arch);
      CHECK(archs == std::set<int>{75, 90, 100});
      CHECK(choose_sample(jobs, count, seed) == chosen);
    }
  }
  std::set<std::vector<std::size_t>> picks;
  for (std::uint64_t seed = 0; seed < 20; ++seed) picks.insert(choose_sample(jobs, 5, seed));
  CHECK(picks.size() > 10);  // seeds choose differently (20 draws of 5 from 72 jobs)
  CHECK(choose_sample(jobs, 1000, 5).size() == jobs.size());
  CHECK(choose_sample({}, 4, 5).empty());
}

TEST_CASE("differences: every kernel whose recorded and compiled reports differ, and kernels on one side only") {
  const Summary recorded = {{"a<1>", {40, 0, 0, 0}}, {"b<1>", {128, 0, 0, 0}}, {"c<1>", {64, 0, 0, 0}}};
  Summary compiled = recorded;
  CHECK(differences(recorded, compiled).empty());
  compiled["b<1>"] = {128, 16, 8, 4};
  compiled.erase("c<1>");
  compiled["d<1>"] = {32, 0, 0, 0};
  const auto d = differences(recorded, compiled);
  REQUIRE(d.size() == 3);
  CHECK(d[0] ==
        "b<1>: recorded 128 registers, 0 bytes stack, 0/0 bytes spilled (stores/loads), compiled 128 "
        "registers, 16 bytes stack, 8/4 bytes spilled (stores/loads)");
  CHECK(d[1].find("c<1>: recorded") == 0);
  CHECK(d[2].find("d<1>: compiled") == 0);
}

TEST_CASE("ptxas' report is read per kernel, and the rules find spills, stack frames and missing kernels") {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function '_Z1av' for 'sm_90'\n"
      "ptxas info    : Function properties for _Z1av\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 1 barriers, 400 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function '_Z1bv' for 'sm_90'\n"
      "ptxas info    : Function properties for _Z1bv\n"
      "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 255 registers, used 1 barriers, 400 bytes cmem[0]\n";
  const Summary s = parse_report(log);
  REQUIRE(s.size() == 2);
  CHECK(s.at("_Z1av") == KernelFacts{40, 0, 0, 0});
  CHECK(s.at("_Z1bv") == KernelFacts{255, 16, 8, 4});
  const auto problems = problems_of(s, {"_Z1av", "_Z1bv", "_Z1cv"});
  REQUIRE(problems.size() == 2);
  CHECK(problems[0] == "_Z1cv: no ptxas report");
  CHECK(problems[1].find("_Z1bv: 255 registers, 16 bytes stack") == 0);
  CHECK(problems_of(s, {"_Z1av"}).at(0) == "_Z1bv: reported, but not a kernel asked for");
  CHECK(problems_of(parse_report(log.substr(0, log.find("ptxas info    : Compiling entry function '_Z1bv'"))),
                    {"_Z1av"})
            .empty());
}

// The run itself on two small real jobs (one kernel each, seconds to compile): a record made from compiles is taken
// with its sample compiled again; a record that lies about one kernel fails where that job is compiled again; a job
// the record does not hold is compiled; a pass remembered here is used without compiling.
TEST_CASE("a run: compiled, remembered, recorded and compiled again; a record that differs from NVRTC fails") {
  testing::TempDir dir("compile-run");
  Job a{75, Layout::ChannelsFirst, DType::BF16, Activation::SiLU, false, {"finalize<1,0>"}};
  Job b{90, Layout::ChannelsFirst, DType::BF16, Activation::SiLU, false, {"apply_padded<1,1,0,0>"}};
  const std::vector<Job> jobs = {a, b};
  const std::string id = identity();
  RunOptions options;
  options.threads = 2;
  options.sample = 1;
  using S = Outcome::Source;

  auto first = run_jobs(jobs, id, options);  // no record, no pass cache: both compiled
  for (const auto& o : first) {
    CHECK(o.source == S::Compiled);
    CHECK(o.error.empty());
    CHECK(o.problems.empty());
    REQUIRE(o.summary.size() == 1);
  }
  const std::string path = dir.file("record.txt");
  std::ofstream(path) << record_text(id, {75, 90}, jobs, {first[0].summary, first[1].summary});
  std::string error;
  auto record = read_record(path, &error);
  REQUIRE_MESSAGE(record, error);
  options.record = &*record;
  auto second = run_jobs(jobs, id, options);  // one job an architecture: both compiled again and equal
  for (const auto& o : second) {
    CHECK(o.source == S::Verified);
    CHECK(o.problems.empty());
  }

  // A record whose registers for sm_90's kernel are one off: the compile disagrees, and the run says where.
  Summary forged = first[1].summary;
  forged.begin()->second.registers += 1;
  std::ofstream(path, std::ios::trunc) << record_text(id, {75, 90}, jobs, {first[0].summary, forged});
  record = read_record(path, &error);
  REQUIRE(record);
  options.record = &*record;
  auto third = run_jobs(jobs, id, options);
  CHECK(third[1].source == S::Verified);
  REQUIRE(third[1].problems.size() == 1);
  CHECK(third[1].problems[0].find("differs from the record: apply_padded<1,1,0,0>: recorded ") == 0);
  // A recorded spill fails whether or not that job is compiled again: sm_75 has two recorded jobs, one of them
  // compiled again; a job the record does not hold is compiled.
  Job c{75, Layout::ChannelsFirst, DType::BF16, Activation::None, false, {"apply_padded<1,1,0,1>"}};
  Job d{90, Layout::ChannelsFirst, DType::BF16, Activation::None, false, {"apply_padded<1,1,0,1>"}};
  const Compiled c_compiled = compile_names(c.arch, c.names);
  Summary spilled = first[0].summary;
  spilled.begin()->second.spill_stores = 8;
  std::ofstream(path, std::ios::trunc) << record_text(id, {75, 90}, {a, b, c},
                                                      {spilled, first[1].summary, c_compiled.summary});
  record = read_record(path, &error);
  REQUIRE(record);
  options.record = &*record;
  options.sample = 0;  // still one an architecture
  for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    options.seed = seed;
    auto fourth = run_jobs({a, b, c, d}, id, options);
    CHECK(fourth[3].source == S::Compiled);
    CHECK(fourth[3].problems.empty());
    CHECK(((fourth[0].source == S::Verified) != (fourth[2].source == S::Verified)));
    CHECK(fourth[1].source == S::Verified);
    CHECK_FALSE(fourth[0].problems.empty());  // recorded as spilled, or compiled again and then not equal
    CHECK(fourth[2].problems.empty());
  }

  // The pass cache: passes compiled here are remembered and used before any record.
  options.pass_cache = dir.file("passes");
  options.record = nullptr;
  auto fifth = run_jobs(jobs, id, options);
  CHECK(fifth[0].source == S::Compiled);
  CHECK(fifth[0].cache_note.empty());
  auto sixth = run_jobs(jobs, id, options);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CHECK(sixth[i].source == S::Remembered);
    CHECK(sixth[i].summary == first[i].summary);
  }
  // Filtered runs read and remember nothing.
  options.filtered = true;
  CHECK(run_jobs(jobs, id, options)[0].source == S::Compiled);
}

TEST_CASE("SHA-256 of known inputs") {
  auto sha = [](const std::string& s) {
    testing::Sha256 h;
    h.add(s);
    return h.hex();
  };
  CHECK(sha("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  testing::Sha256 million;
  const std::string a(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.add(a);
  CHECK(million.hex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  testing::TempDir dir("sha");
  std::ofstream(dir.file("f")) << "abc";
  CHECK(testing::sha256_of_file(dir.file("f")) == sha("abc"));
  CHECK_FALSE(testing::sha256_of_file(dir.file("missing")));
}

TEST_CASE("a compile error carries NVRTC's log and options") {
  gnsilu::detail::CompileRequest request;
  request.arch = 90;
  request.names = {"gnsilu::kernel::no_such_kernel<1>"};
  try {
    gnsilu::detail::compile(request);
    FAIL("expected a CompileError");
  } catch (const gnsilu::CompileError& e) {
    CHECK(e.status() == gnsilu::Status::Compile);
    CHECK(e.options().find("--fmad=false") != std::string::npos);
  } catch (const gnsilu::Error& e) {
    // NVRTC may reject the name expression itself rather than the compilation.
    CHECK(e.status() == gnsilu::Status::Compile);
  }
  request.names.clear();
  request.arch = 70;
  CHECK_THROWS_AS(gnsilu::detail::compile(request), gnsilu::Error);
}
