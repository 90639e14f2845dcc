// Every kernel variant (9 dtype pairs x every candidate configuration x both layouts x both activations) compiles
// with NVRTC with no stack frame and no register spills (ptxas' report). NVRTC needs no GPU, so this runs in CI.
//
// Which architectures (GNSILU_TEST_ARCHS):
// - unset or empty: one architecture per ptxas class (kArchClasses below: ptxas gives every kernel the same
//   registers, stack and spills within a class), and any architecture this NVRTC offers that no class names;
// - "all": every architecture this NVRTC offers from sm_75 up. When a class's representative and its siblings are
//   all compiled, every sibling's per-kernel summary must equal the representative's: tools/compile_all_archs.sh
//   runs this, and a failure there means kArchClasses must change;
// - a list ("90,100"): those; an entry this NVRTC cannot compile for fails the test.
// The work is cut into one job per (architecture, layout, activation) and the jobs run on every core.
//
// GNSILU_TEST_KERNELS=<substrings, separated by spaces or ';'> (opt-in): each job compiles only the kernels whose
// name expression contains one of them ("fused<1,1,16,32,1,0> chunk_stats<3,"), under the same rules: a check of
// chosen instances on every architecture in minutes before a full run (a kernel change needs a cold one: over an
// hour and a half on 2 cores). A filtered job's result is neither read from nor written to the pass cache, and the
// test says that it ran filtered.
//
// GNSILU_COMPILE_PASS_CACHE=<folder> (opt-in; .ci/run sets it): a job that passed is remembered there under a key
// of everything its verdict depends on (the kernel sources' SHA-256, NVRTC's version and library file, the options,
// the architecture and the kernel names, and this test's rules); the same job later reads its per-kernel summary
// from there instead of compiling. Only passes are remembered, and a file whose key text is not the job's exactly is
// ignored.
#include <dlfcn.h>
#include <nvrtc.h>
#include <sys/stat.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "base/hash.hpp"
#include "cache/transfer/atomic_file.hpp"
#include "runtime/compiler.hpp"
#include "runtime/kernel_sources.hpp"
#include "runtime/kernels.hpp"
#include "gnsilu/gnsilu.hpp"
#include "temp_dir.hpp"

namespace {

using gnsilu::Activation;
using gnsilu::DType;
using gnsilu::Layout;

// ptxas classes: within one, ptxas gave every kernel the same registers, stack and spills (tools/compile_all_archs.sh
// checks it over every kernel). CI compiles the representatives only.
struct ArchClass {
  int representative;
  std::vector<int> siblings;
};
// (sm_110 is not sm_103's sibling: tools/compile_all_archs.sh found 6 apply kernels with 2 to 4 more registers.)
const std::vector<ArchClass> kArchClasses = {
    {75, {}}, {80, {}}, {86, {87, 88, 89}}, {90, {}}, {100, {}}, {103, {}}, {110, {}}, {120, {121}},
};

// What this test counts as a pass. Part of the pass cache's key: change it when the rules below change.
constexpr const char* kRules = "rules 1: no stack frame, no spill stores or loads, one report per kernel";

struct KernelFacts {
  int registers = -1;
  long stack = -1, spill_stores = -1, spill_loads = -1;
  friend bool operator==(const KernelFacts&, const KernelFacts&) = default;
};
using Summary = std::map<std::string, KernelFacts>;  // mangled kernel name -> ptxas' report

std::string text_of(const KernelFacts& k) {
  return std::to_string(k.registers) + " registers, " + std::to_string(k.stack) + " bytes stack, " +
         std::to_string(k.spill_stores) + "/" + std::to_string(k.spill_loads) + " bytes spilled (stores/loads)";
}

// ---- which architectures -------------------------------------------------------------------------------------
struct Selection {
  std::vector<int> archs;
  std::string error;  // non-empty: the variable is wrong, and says why
  std::string note;   // what was chosen and why
};

std::vector<int> eligible(const std::vector<int>& supported) {
  std::vector<int> out;
  for (int a : supported)
    if (a >= 75) out.push_back(a);
  return out;
}

Selection select_archs(const char* variable, const std::vector<int>& supported) {
  Selection s;
  const std::vector<int> all = eligible(supported);
  const std::string value = variable == nullptr ? "" : variable;
  if (all.empty()) {
    s.error = "this NVRTC offers no architecture from sm_75 up";
    return s;
  }
  if (value.empty()) {
    std::set<int> named;
    for (const auto& c : kArchClasses) {
      named.insert(c.representative);
      named.insert(c.siblings.begin(), c.siblings.end());
      if (std::find(all.begin(), all.end(), c.representative) != all.end()) s.archs.push_back(c.representative);
    }
    std::vector<int> unclassed;
    for (int a : all)
      if (named.count(a) == 0) unclassed.push_back(a);
    s.archs.insert(s.archs.end(), unclassed.begin(), unclassed.end());
    std::sort(s.archs.begin(), s.archs.end());
    s.note = "one architecture per ptxas class (" + std::to_string(s.archs.size()) + " of " +
             std::to_string(all.size()) + "; GNSILU_TEST_ARCHS=all compiles every one)";
    for (int a : unclassed) s.note += "; sm_" + std::to_string(a) + " is in no class: compiled as its own";
    return s;
  }
  if (value == "all") {
    s.archs = all;
    s.note = "GNSILU_TEST_ARCHS=all: every architecture from sm_75 up (" + std::to_string(all.size()) + ")";
    return s;
  }
  std::vector<std::string> items;
  for (std::size_t start = 0;;) {
    const auto comma = value.find(',', start);
    items.push_back(value.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (const std::string& item : items) {
    const bool digits = !item.empty() && item.size() <= 4 && item.find_first_not_of("0123456789") == std::string::npos;
    const int arch = digits ? std::stoi(item) : 0;
    if (!digits || std::find(all.begin(), all.end(), arch) == all.end()) {
      std::string offered;
      for (int a : all) offered += (offered.empty() ? "" : ",") + std::to_string(a);
      s.error = "GNSILU_TEST_ARCHS=" + value + ": '" + item +
                "' is not an architecture this NVRTC compiles for from sm_75 up (it offers " + offered + ", or 'all')";
      s.archs.clear();
      return s;
    }
    if (std::find(s.archs.begin(), s.archs.end(), arch) == s.archs.end()) s.archs.push_back(arch);
  }
  std::sort(s.archs.begin(), s.archs.end());
  s.note = "GNSILU_TEST_ARCHS=" + value + ": " + std::to_string(s.archs.size()) + " architectures";
  return s;
}

// ---- one job: an architecture's variants of one layout and activation -------------------------------------------
struct Job {
  int arch = 0;
  Layout layout = Layout::ChannelsFirst;
  Activation activation = Activation::SiLU;
  std::string label() const {
    return "sm_" + std::to_string(arch) + " " + gnsilu::layout_name(layout) + " " +
           gnsilu::activation_name(activation);
  }
};

std::vector<gnsilu::detail::Variant> variants_of(const Job& job) {
  std::vector<gnsilu::detail::Variant> out;
  for (DType x : {DType::BF16, DType::FP16, DType::FP32})
    for (DType y : {DType::BF16, DType::FP16, DType::FP32})
      for (const auto& c : gnsilu::candidate_configs()) out.push_back({x, y, c, job.layout, job.activation});
  return out;
}

const std::vector<std::string> kExtraOptions = {"--ptxas-options=-v"};

// NVRTC as loaded: its version and its library file (path, size, modification time).
std::string nvrtc_identity() {
  std::string text = "nvrtc " + gnsilu::detail::nvrtc_version();
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) != 0 && info.dli_fname != nullptr) {
    struct stat st {};
    const std::string path = std::filesystem::weakly_canonical(info.dli_fname).string();
    text += " " + path;
    if (stat(path.c_str(), &st) == 0) {
      text += " " + std::to_string(st.st_size) + " bytes, mtime " + std::to_string(st.st_mtim.tv_sec) + "." +
              std::to_string(st.st_mtim.tv_nsec);
    }
  } else {
    text += " (library file unknown)";
  }
  return text;
}

// Everything a job's verdict depends on, as text.
std::string job_key(const Job& job) {
  std::string key = "gnsilu test_compile pass\n";
  key += std::string(kRules) + "\n";
  key += "sources " + std::string(gnsilu::detail::kKernelSourceHash) + "\n";
  key += nvrtc_identity() + "\n";
  key += "arch " + std::to_string(job.arch) + "\n";
  std::vector<std::string> options = gnsilu::detail::fixed_options(job.arch, true);
  options.insert(options.end(), kExtraOptions.begin(), kExtraOptions.end());
  key += "options";
  for (const auto& o : options) key += " " + o;
  key += "\nnames";
  for (const auto& v : variants_of(job))
    for (const auto& name : gnsilu::detail::kernel_names(v)) key += " " + name;
  return key + "\n";
}

std::string key_file(const std::string& folder, const std::string& key) {
  gnsilu::detail::Fnv1a h;
  h.add(key);
  return folder + "/" + h.hex() + ".pass";
}

std::string summary_text(const Summary& s) {
  std::string out;
  for (const auto& [name, k] : s) {
    out += name + " " + std::to_string(k.registers) + " " + std::to_string(k.stack) + " " +
           std::to_string(k.spill_stores) + " " + std::to_string(k.spill_loads) + "\n";
  }
  return out;
}

// A remembered pass: the file's key text must be the job's, byte for byte.
std::optional<Summary> remembered(const std::string& folder, const std::string& key) {
  std::ifstream in(key_file(folder, key), std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream whole;
  whole << in.rdbuf();
  const std::string text = whole.str();
  const std::string marker = "---\n";
  if (text.size() < key.size() + marker.size() || text.compare(0, key.size(), key) != 0 ||
      text.compare(key.size(), marker.size(), marker) != 0)
    return std::nullopt;
  Summary s;
  std::istringstream lines(text.substr(key.size() + marker.size()));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string name;
    KernelFacts k;
    if (!(fields >> name >> k.registers >> k.stack >> k.spill_stores >> k.spill_loads)) return std::nullopt;
    s[name] = k;
  }
  if (s.empty()) return std::nullopt;
  return s;
}

std::optional<std::string> remember(const std::string& folder, const std::string& key, const Summary& s) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return "cannot create " + folder + ": " + ec.message();
  if (auto problem = gnsilu::detail::write_file_atomically(key_file(folder, key), key + "---\n" + summary_text(s)))
    return key_file(folder, key) + " " + *problem;
  return std::nullopt;
}

// ptxas' -v report: per entry function, its registers, stack frame and spills.
Summary parse_report(const std::string& log) {
  const std::regex entry(R"(Compiling entry function '([^']+)')");
  const std::regex properties(R"(Function properties for (\S+))");
  const std::regex frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  const std::regex registers(R"(Used (\d+) registers)");
  Summary s;
  std::istringstream in(log);
  std::string line, function;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, entry)) {
      function = m[1];
    } else if (std::regex_search(line, m, properties)) {
      function = m[1];
    } else if (std::regex_search(line, m, frame) && !function.empty()) {
      KernelFacts& k = s[function];
      k.stack = std::stol(m[1]);
      k.spill_stores = std::stol(m[2]);
      k.spill_loads = std::stol(m[3]);
    } else if (std::regex_search(line, m, registers) && !function.empty()) {
      s[function].registers = std::stoi(m[1]);
    }
  }
  return s;
}

struct JobResult {
  Summary summary;
  std::vector<std::string> problems;
  double seconds = 0;
  bool from_cache = false;
  std::string cache_note;  // a pass that could not be remembered
};

// The rules: one complete report per kernel asked for, no stack frame, no spills.
std::vector<std::string> problems_of(const Summary& s, const std::set<std::string>& lowered) {
  std::vector<std::string> problems;
  for (const auto& name : lowered)
    if (s.count(name) == 0) problems.push_back(name + ": no ptxas report");
  for (const auto& [name, k] : s) {
    if (lowered.count(name) == 0) problems.push_back(name + ": reported, but not a kernel asked for");
    if (k.registers < 0 || k.stack < 0) problems.push_back(name + ": incomplete report");
    if (k.stack != 0 || k.spill_stores != 0 || k.spill_loads != 0) problems.push_back(name + ": " + text_of(k));
  }
  return problems;
}

// GNSILU_TEST_KERNELS as a list of substrings (separated by spaces or ';': a kernel's template arguments hold
// commas); none: every kernel.
std::vector<std::string> kernel_filter(const char* value) {
  std::vector<std::string> out;
  if (value == nullptr) return out;
  std::string text(value);
  std::replace(text.begin(), text.end(), ';', ' ');
  std::istringstream items(text);
  for (std::string item; items >> item;) out.push_back(item);
  return out;
}

// The job's kernel name expressions that contain one of `filter`'s substrings (all of them without a filter).
std::vector<std::string> job_names(const Job& job, const std::vector<std::string>& filter) {
  std::vector<std::string> names;
  for (const auto& v : variants_of(job)) {
    for (const auto& name : gnsilu::detail::kernel_names(v)) {
      const bool wanted = filter.empty() || std::any_of(filter.begin(), filter.end(), [&](const std::string& f) {
                            return name.find(f) != std::string::npos;
                          });
      if (wanted && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  return names;
}

// A job: every kernel of its variants, or with a filter only its kernels (and then no pass is read or written).
JobResult run_job(const Job& job, const std::string& cache_folder, const std::vector<std::string>& filter) {
  JobResult r;
  const bool remembers = !cache_folder.empty() && filter.empty();
  const std::string key = remembers ? job_key(job) : "";
  if (remembers) {
    if (auto s = remembered(cache_folder, key)) {
      r.summary = std::move(*s);
      r.from_cache = true;
      return r;
    }
  }
  gnsilu::detail::CompileRequest request;
  request.arch = job.arch;
  request.names = job_names(job, filter);
  request.extra_options = kExtraOptions;
  if (request.names.empty()) return r;  // no kernel of this job matches the filter
  const auto started = std::chrono::steady_clock::now();
  const auto program = gnsilu::detail::compile(request);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  r.summary = parse_report(program.log);
  r.problems = problems_of(r.summary, {program.lowered_names.begin(), program.lowered_names.end()});
  if (r.problems.empty() && remembers) {
    if (auto problem = remember(cache_folder, key, r.summary)) r.cache_note = *problem;
  }
  return r;
}

}  // namespace

TEST_CASE("every kernel variant compiles without spills for the architectures under test") {
  const Selection selection = select_archs(std::getenv("GNSILU_TEST_ARCHS"), gnsilu::detail::supported_archs());
  REQUIRE_MESSAGE(selection.error.empty(), selection.error);
  REQUIRE_FALSE(selection.archs.empty());
  MESSAGE(selection.note);
  const char* cache_env = std::getenv("GNSILU_COMPILE_PASS_CACHE");
  const std::string cache_folder = cache_env == nullptr ? "" : cache_env;
  const std::vector<std::string> filter = kernel_filter(std::getenv("GNSILU_TEST_KERNELS"));
  if (!filter.empty()) {
    MESSAGE("GNSILU_TEST_KERNELS=" << std::string(std::getenv("GNSILU_TEST_KERNELS"))
                                   << ": filtered, nothing remembered");
  }

  std::vector<Job> jobs;
  for (int arch : selection.archs)
    for (Layout layout : {Layout::ChannelsLast, Layout::ChannelsFirst})
      for (Activation activation : {Activation::SiLU, Activation::None}) jobs.push_back({arch, layout, activation});
  std::vector<std::optional<JobResult>> results(jobs.size());
  std::vector<std::string> errors;
  std::mutex mutex;
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  const auto started = std::chrono::steady_clock::now();
  for (unsigned w = 0; w < std::min<std::size_t>(workers, jobs.size()); ++w) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next++) < jobs.size();) {
        try {
          results[i] = run_job(jobs[i], cache_folder, filter);
        } catch (const gnsilu::CompileError& e) {
          std::lock_guard lock(mutex);
          errors.push_back(jobs[i].label() + ": " + e.what() + "\noptions: " + e.options());
        } catch (const std::exception& e) {
          std::lock_guard lock(mutex);
          errors.push_back(jobs[i].label() + ": " + e.what());
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  for (const auto& e : errors) FAIL_CHECK(e);

  std::map<int, Summary> by_arch;
  std::size_t compiled = 0, from_cache = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (!results[i]) continue;
    const JobResult& r = *results[i];
    if (r.summary.empty() && !filter.empty()) {
      MESSAGE(jobs[i].label() << ": no kernel matches GNSILU_TEST_KERNELS");
      continue;
    }
    (r.from_cache ? from_cache : compiled)++;
    int most = 0;
    for (const auto& [name, k] : r.summary) most = std::max(most, k.registers);
    MESSAGE(jobs[i].label() << ": " << r.summary.size() << " kernels, at most " << most << " registers, "
                            << (r.from_cache ? std::string("a remembered pass") : std::to_string(r.seconds) + " s"));
    if (!r.cache_note.empty()) MESSAGE("pass not remembered: " << r.cache_note);
    CHECK(!r.summary.empty());
    for (const auto& p : r.problems) FAIL_CHECK(jobs[i].label() << " " << p);
    by_arch[jobs[i].arch].insert(r.summary.begin(), r.summary.end());
  }
  MESSAGE(jobs.size() << " jobs on " << workers << " threads: " << compiled << " compiled, " << from_cache
                      << " remembered (GNSILU_COMPILE_PASS_CACHE=" << (cache_folder.empty() ? "unset" : cache_folder)
                      << "), "
                      << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s");

  // Siblings against their representative, where both were compiled.
  for (const auto& c : kArchClasses) {
    if (by_arch.count(c.representative) == 0) continue;
    const Summary& rep = by_arch[c.representative];
    for (int sibling : c.siblings) {
      if (by_arch.count(sibling) == 0) continue;
      const Summary& sib = by_arch[sibling];
      std::vector<std::string> differences;
      for (const auto& [name, k] : rep) {
        const auto it = sib.find(name);
        if (it == sib.end()) {
          differences.push_back(name + ": missing on sm_" + std::to_string(sibling));
        } else if (!(it->second == k)) {
          differences.push_back(name + ": sm_" + std::to_string(c.representative) + " " + text_of(k) + ", sm_" +
                                std::to_string(sibling) + " " + text_of(it->second));
        }
      }
      for (const auto& [name, k] : sib)
        if (rep.count(name) == 0) differences.push_back(name + ": only on sm_" + std::to_string(sibling));
      MESSAGE("sm_" << sibling << " against its class's sm_" << c.representative << ": " << differences.size()
                    << " of " << rep.size() << " kernels differ");
      for (std::size_t i = 0; i < std::min<std::size_t>(differences.size(), 20); ++i) FAIL_CHECK(differences[i]);
      CHECK_MESSAGE(differences.empty(), "sm_" << sibling << " is not in sm_" << c.representative
                                                << "'s ptxas class: change kArchClasses in tests/kernels/test_compile.cpp");
    }
  }
}

TEST_CASE("GNSILU_TEST_ARCHS: the classes' representatives by default, 'all', a list; a wrong entry is an error") {
  const std::vector<int> offered = {52, 75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
  Selection s = select_archs(nullptr, offered);
  CHECK(s.error.empty());
  CHECK(s.archs == std::vector<int>{75, 80, 86, 90, 100, 103, 110, 120});
  CHECK(select_archs("", offered).archs == s.archs);
  s = select_archs("all", offered);
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
  for (const auto& c : kArchClasses) {
    CHECK(seen.insert(c.representative).second);
    for (int a : c.siblings) CHECK(seen.insert(a).second);
  }
}

TEST_CASE("GNSILU_TEST_KERNELS: substrings of the kernels' name expressions; a job keeps the names that contain one") {
  CHECK(kernel_filter(nullptr).empty());
  CHECK(kernel_filter("").empty());
  CHECK(kernel_filter(" ;; ").empty());
  CHECK(kernel_filter("fused<1,1,16,32,1,0> apply<").size() == 2);  // commas belong to the template arguments
  CHECK(kernel_filter("finalize;apply_padded").size() == 2);
  const Job job{90, Layout::ChannelsLast, Activation::SiLU};
  const auto all = job_names(job, {});
  const auto finalize = job_names(job, {"finalize<"});
  CHECK(finalize.size() == 3);  // one a dtype of x, whatever y and the configuration
  for (const auto& name : finalize) CHECK(name.find("gnsilu::kernel::finalize<") == 0);
  const auto two = job_names(job, {"apply_padded<1,1,1,0>", "finalize<3,1>"});
  CHECK(two == std::vector<std::string>{"gnsilu::kernel::apply_padded<1,1,1,0>", "gnsilu::kernel::finalize<3,1>"});
  CHECK(job_names(job, {"no such kernel"}).empty());
  CHECK(all.size() > finalize.size());
}

TEST_CASE("the pass cache: a pass is read back only under the same key, and damaged files are ignored") {
  testing::TempDir dir("compile-pass");
  const std::string folder = dir.file("passes");
  const Job job{90, Layout::ChannelsLast, Activation::SiLU};
  const std::string key = job_key(job);
  // The key names what the verdict depends on.
  CHECK(key.find(gnsilu::detail::kKernelSourceHash) != std::string::npos);
  CHECK(key.find("nvrtc " + gnsilu::detail::nvrtc_version()) != std::string::npos);
  CHECK(key.find("--fmad=false") != std::string::npos);
  CHECK(key.find("--gpu-architecture=sm_90") != std::string::npos);
  CHECK(key.find(kRules) != std::string::npos);
  for (const auto& name : gnsilu::detail::kernel_names(variants_of(job).front())) CHECK(key.find(name) != std::string::npos);
  // Every other job has another key.
  CHECK(job_key({100, Layout::ChannelsLast, Activation::SiLU}) != key);
  CHECK(job_key({90, Layout::ChannelsFirst, Activation::SiLU}) != key);
  CHECK(job_key({90, Layout::ChannelsLast, Activation::None}) != key);

  CHECK_FALSE(remembered(folder, key));  // nothing yet (and no folder)
  const Summary summary = {{"_Z1av", {40, 0, 0, 0}}, {"_Z1bv", {255, 0, 0, 0}}};
  REQUIRE_FALSE(remember(folder, key, summary));
  const auto back = remembered(folder, key);
  REQUIRE(back);
  CHECK(*back == summary);
  CHECK_FALSE(remembered(folder, job_key({100, Layout::ChannelsLast, Activation::SiLU})));

  // The same file name under another key (a hash collision, or a file edited by hand): ignored.
  const std::string path = key_file(folder, key);
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  auto rewrite = [&](const std::string& contents) {
    std::ofstream(path, std::ios::trunc) << contents;
  };
  std::string other = text;
  other.replace(other.find("arch 90"), 7, "arch 91");
  rewrite(other);
  CHECK_FALSE(remembered(folder, key));
  rewrite(text.substr(0, text.size() - 5));  // cut inside the summary
  CHECK_FALSE(remembered(folder, key));
  rewrite(key + "---\n");  // no kernels
  CHECK_FALSE(remembered(folder, key));
  rewrite(text);
  CHECK(remembered(folder, key));
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
  CHECK(problems_of(parse_report(log.substr(0, log.find("ptxas info    : Compiling entry function '_Z1bv'"))),
                    {"_Z1av"})
            .empty());
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
