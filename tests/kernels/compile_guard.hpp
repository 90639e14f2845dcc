// The compile guard's parts (tests/kernels/test_compile.cpp runs them): every kernel instantiation the library can
// launch, compiled by NVRTC with the library's options for one architecture of each ptxas class, must have no stack
// frame and no spill in ptxas' report.
//
// Jobs. An architecture's kernels are the distinct name expressions of every variant (9 dtype pairs x the candidate
// configurations x both layouts x both activations): each instantiation is compiled once, in one job. A job is one
// NVRTC program: one layout, dtype of x and activation, either the fused kernels or the split path's (apply,
// apply_padded, and for SiLU jobs the statistics kernels, which do not depend on the activation).
//
// Three sources of a job's per-kernel report, each under a key of everything the verdict depends on (the rules, the
// kernel sources' SHA-256, NVRTC's version and the SHA-256 of its library file, the options, the architecture and the
// job's kernel names):
// - a compile here;
// - a pass remembered on this machine (GNSILU_COMPILE_PASS_CACHE: a job compiled and passed here earlier);
// - the committed record (tests/kernels/compile_record.txt, written by tools/compile_all_archs.sh on any machine with
//   the same NVRTC library): accepted only where its key is the tree's exactly, and then only after a random
//   sample of its jobs, at least one an architecture, is compiled here and gives the recorded report kernel for
//   kernel.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gnsilu/gnsilu.hpp"

namespace gnsilu::test::compile_guard {

// What the guard counts as a pass. Part of every key: change it when the rules change.
inline constexpr const char* kRules = "rules 2: no stack frame, no spill stores or loads, one report per kernel";

struct KernelFacts {
  int registers = -1;
  long stack = -1, spill_stores = -1, spill_loads = -1;
  friend bool operator==(const KernelFacts&, const KernelFacts&) = default;
};
// A kernel's name expression without "gnsilu::kernel::" ("apply<1,1,16,32,0,0,0>") -> ptxas' report of it.
using Summary = std::map<std::string, KernelFacts>;
std::string text_of(const KernelFacts& k);

// ---- architectures ---------------------------------------------------------------------------------------------
// ptxas classes: within one, ptxas gave every kernel the same registers, stack and spills (tools/compile_all_archs.sh
// checks it over every kernel). CI compiles the representatives.
struct ArchClass {
  int representative;
  std::vector<int> siblings;
};
const std::vector<ArchClass>& arch_classes();

struct Selection {
  std::vector<int> archs;
  bool all = false;   // GNSILU_TEST_ARCHS=all: every architecture, siblings checked against representatives
  std::string error;  // non-empty: the variable is wrong, and says why
  std::string note;   // what was chosen and why
};
// GNSILU_TEST_ARCHS: unset or empty, one architecture per class (and any this NVRTC offers that no class names);
// "all", every one from sm_75 up; a list ("90,100"), those.
Selection select_archs(const char* variable, const std::vector<int>& supported);

// ---- jobs ----------------------------------------------------------------------------------------------------------
struct Job {
  int arch = 0;
  Layout layout = Layout::ChannelsFirst;
  DType x = DType::BF16;
  Activation activation = Activation::SiLU;
  bool fused = false;
  std::vector<std::string> names;  // short name expressions, in the order the variants give them
  std::string label() const;       // "sm_90 nhwc bf16 silu fused"
  double cost() const;             // a rough estimate of its compile time, to start the longest jobs first
};
// Every distinct kernel instantiation of the library for `arch`, each in exactly one job.
std::vector<Job> jobs_of(int arch);

// GNSILU_TEST_KERNELS as a list of substrings (separated by spaces or ';': template arguments hold commas).
std::vector<std::string> kernel_filter(const char* value);
// The job's names that contain one of `filter`'s substrings (all of them without a filter).
std::vector<std::string> filtered_names(const Job& job, const std::vector<std::string>& filter);

// ---- keys -----------------------------------------------------------------------------------------------------------
// What every job's verdict depends on besides its architecture and names, as lines of text: the rules, the kernel
// sources' SHA-256, NVRTC's version and its library file's SHA-256, the options without the architecture.
std::string identity();
std::string job_key(const std::string& identity, const Job& job);

// ---- compiling ------------------------------------------------------------------------------------------------------
// ptxas' -v report: per entry function (mangled name), its registers, stack frame and spills.
Summary parse_report(const std::string& log);
// The rules: one complete report per kernel asked for, no stack frame, no spills.
std::vector<std::string> problems_of(const Summary& s, const std::vector<std::string>& names);

struct Compiled {
  Summary summary;  // by short name expression (only what ptxas reported for a kernel asked for)
  std::vector<std::string> problems;
  double seconds = 0;            // NVRTC to a CUBIN: the front end and ptxas
  double front_end_seconds = 0;  // with `profile`: the same names to PTX only (the front end alone), compiled first
};
// Compiles `names` of the job's architecture (throws gnsilu::CompileError with NVRTC's log).
Compiled compile_names(int arch, const std::vector<std::string>& names, bool profile = false);

// ---- what a machine remembers: passes compiled here (GNSILU_COMPILE_PASS_CACHE) -------------------------------------
std::string pass_file(const std::string& folder, const std::string& key);
std::optional<Summary> remembered(const std::string& folder, const std::string& key);
std::optional<std::string> remember(const std::string& folder, const std::string& key, const Summary& s);

// ---- the committed record ------------------------------------------------------------------------------------------
struct RecordJob {
  int arch = 0;
  std::string label;
  Summary summary;  // in the record's order of names
  std::vector<std::string> names;
};
struct Record {
  std::string identity;    // the lines identity() gives
  std::vector<int> archs;  // the architectures it covers (every one compile_all_archs compiled)
  std::vector<RecordJob> jobs;
  // The recorded report of `job`, where the record holds a job of that architecture and label with exactly its names.
  const Summary* find(const Job& job) const;
};
// Reads a record; nothing (and *error says why) where the file is missing or not a record.
std::optional<Record> read_record(const std::string& path, std::string* error);
// The record's text for `jobs` with their summaries (jobs[i] -> summaries[i]).
std::string record_text(const std::string& identity, const std::vector<int>& archs, const std::vector<Job>& jobs,
                        const std::vector<Summary>& summaries);
// Where the record's identity differs from `identity`: the first differing line of each, or nothing when equal.
std::optional<std::string> identity_difference(const std::string& recorded, const std::string& identity);

// ---- the sample -----------------------------------------------------------------------------------------------------
// Which of `jobs` (indices) to compile and compare with the record: one at random from every architecture among them,
// then more at random up to `count` in all (every job when count >= jobs.size()). Deterministic for a seed.
std::vector<std::size_t> choose_sample(const std::vector<Job>& jobs, std::size_t count, std::uint64_t seed);
// Kernel by kernel, where a compiled report differs from the recorded one (empty: none).
std::vector<std::string> differences(const Summary& recorded, const Summary& compiled);

// ---- a run ----------------------------------------------------------------------------------------------------------
struct RunOptions {
  std::string pass_cache;          // GNSILU_COMPILE_PASS_CACHE: passes remembered here ("" none)
  const Record* record = nullptr;  // a record whose identity is this tree's (or none)
  std::size_t sample = 0;          // jobs taken from the record that are compiled again (at least one an architecture)
  std::uint64_t seed = 0;          // which ones
  unsigned threads = 1;
  bool filtered = false;  // GNSILU_TEST_KERNELS: jobs hold some of their kernels; nothing read or remembered
  bool profile = false;   // GNSILU_COMPILE_PROFILE: time each compiled job's front end apart as well
};
struct Outcome {
  // Verified: taken from the record and compiled again (its problems say where the two differ)
  enum class Source { Compiled, Remembered, Recorded, Verified } source = Source::Compiled;
  Summary summary;                    // the job's reports, whatever their source
  std::vector<std::string> problems;  // broken rules, and for a verified job every difference from the record
  std::string error;                  // a failed compile (NVRTC's log and options)
  std::string cache_note;             // a pass that could not be remembered
  double seconds = 0;                 // compile time (Compiled, Verified)
  double front_end_seconds = 0;       // with RunOptions::profile: its front end alone (PTX)
};
const char* source_name(Outcome::Source s);
// Each job's reports: remembered where the pass cache has its key, else recorded where the record holds it (a sample
// of those compiled again and compared), else compiled; every job's reports checked against the rules. Compiles run
// on `threads` threads, the longest jobs first.
std::vector<Outcome> run_jobs(const std::vector<Job>& jobs, const std::string& identity, const RunOptions& options);

}  // namespace gnsilu::test::compile_guard
