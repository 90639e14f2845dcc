#include "kernels/compile_guard.hpp"

#include <dlfcn.h>
#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "base/hash.hpp"
#include "cache/transfer/atomic_file.hpp"
#include "kernels/sha256.hpp"
#include "runtime/compiler.hpp"
#include "runtime/kernel_sources.hpp"
#include "runtime/kernels.hpp"

namespace gnsilu::test::compile_guard {
namespace {

constexpr const char* kPrefix = "gnsilu::kernel::";
const std::vector<std::string> kExtraOptions = {"--ptxas-options=-v"};

std::string short_name(const std::string& full) {
  return full.rfind(kPrefix, 0) == 0 ? full.substr(std::char_traits<char>::length(kPrefix)) : full;
}

// NVRTC as loaded: its version and the SHA-256 of its library file (the same file on two machines gives the same
// text; its path and time stamps are left out).
std::string nvrtc_identity() {
  std::string text = "nvrtc " + gnsilu::detail::nvrtc_version();
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ec;
    const auto path = std::filesystem::canonical(info.dli_fname, ec);
    const auto digest = ec ? std::nullopt : testing::sha256_of_file(path.string());
    text += ", " + path.filename().string() + " sha256 " + (digest ? *digest : std::string("unreadable"));
  } else {
    text += ", library file unknown";
  }
  return text;
}

std::vector<std::string> options_of(int arch) {
  std::vector<std::string> options = gnsilu::detail::fixed_options(arch, true);
  options.insert(options.end(), kExtraOptions.begin(), kExtraOptions.end());
  return options;
}

}  // namespace

std::string text_of(const KernelFacts& k) {
  return std::to_string(k.registers) + " registers, " + std::to_string(k.stack) + " bytes stack, " +
         std::to_string(k.spill_stores) + "/" + std::to_string(k.spill_loads) + " bytes spilled (stores/loads)";
}

// ---- architectures ---------------------------------------------------------------------------------------------
const std::vector<ArchClass>& arch_classes() {
  // (sm_110 is not sm_103's sibling: tools/compile_all_archs.sh found 6 apply kernels with 2 to 4 more registers.)
  static const std::vector<ArchClass> classes = {
      {75, {}}, {80, {}}, {86, {87, 88, 89}}, {90, {}}, {100, {}}, {103, {}}, {110, {}}, {120, {121}},
  };
  return classes;
}

Selection select_archs(const char* variable, const std::vector<int>& supported) {
  Selection s;
  std::vector<int> all;
  for (int a : supported)
    if (a >= 75) all.push_back(a);
  const std::string value = variable == nullptr ? "" : variable;
  if (all.empty()) {
    s.error = "this NVRTC offers no architecture from sm_75 up";
    return s;
  }
  if (value.empty()) {
    std::set<int> named;
    for (const auto& c : arch_classes()) {
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
    s.all = true;
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

// ---- jobs ----------------------------------------------------------------------------------------------------------
std::string Job::label() const {
  return "sm_" + std::to_string(arch) + " " + layout_name(layout) + " " + dtype_name(x) + " " +
         activation_name(activation) + (fused ? " fused" : " split");
}

double Job::cost() const {
  // Seconds a kernel on one core of the development machine, by kind (CONTRIBUTING.md): only the order matters.
  static const std::pair<const char*, double> kSeconds[] = {
      {"fused<", 2.0}, {"chunk_stats<", 0.8}, {"finalize<", 1.2}, {"apply_padded<", 0.4}, {"apply<", 0.2}};
  double seconds = 0;
  for (const auto& name : names) {
    for (const auto& [prefix, s] : kSeconds) {
      if (name.rfind(prefix, 0) == 0) {
        seconds += s;
        break;
      }
    }
  }
  return layout == Layout::ChannelsLast ? seconds * 1.6 : seconds;
}

std::vector<Job> jobs_of(int arch) {
  using gnsilu::detail::KernelIndex;
  std::vector<Job> jobs;
  std::set<std::string> seen;
  for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast}) {
    for (DType x : {DType::BF16, DType::FP16, DType::FP32}) {
      for (Activation activation : {Activation::SiLU, Activation::None}) {
        for (bool fused : {false, true}) {
          Job job{arch, layout, x, activation, fused, {}};
          for (DType y : {DType::BF16, DType::FP16, DType::FP32}) {
            for (const auto& config : gnsilu::candidate_configs()) {
              const auto names = gnsilu::detail::kernel_names({x, y, config, layout, activation});
              for (int k = 0; k < gnsilu::detail::kKernelCount; ++k) {
                if ((k == KernelIndex::kFused) != fused) continue;
                const std::string name = short_name(names[static_cast<std::size_t>(k)]);
                if (seen.insert(name).second) job.names.push_back(name);
              }
            }
          }
          if (!job.names.empty()) jobs.push_back(std::move(job));
        }
      }
    }
  }
  return jobs;
}

std::vector<std::string> kernel_filter(const char* value) {
  std::vector<std::string> out;
  if (value == nullptr) return out;
  std::string text(value);
  std::replace(text.begin(), text.end(), ';', ' ');
  std::istringstream items(text);
  for (std::string item; items >> item;) out.push_back(short_name(item));
  return out;
}

std::vector<std::string> filtered_names(const Job& job, const std::vector<std::string>& filter) {
  if (filter.empty()) return job.names;
  std::vector<std::string> names;
  for (const auto& name : job.names) {
    if (std::any_of(filter.begin(), filter.end(),
                    [&](const std::string& f) { return name.find(f) != std::string::npos; }))
      names.push_back(name);
  }
  return names;
}

// ---- keys -----------------------------------------------------------------------------------------------------------
std::string identity() {
  static const std::string text = [] {
    std::string t = std::string(kRules) + "\n";
    t += "sources sha256 " + std::string(gnsilu::detail::kKernelSourceHash) + "\n";
    t += nvrtc_identity() + "\n";
    t += "options";
    for (const auto& o : options_of(0))
      if (o.rfind("--gpu-architecture", 0) != 0) t += " " + o;
    return t + "\n";
  }();
  return text;
}

std::string job_key(const std::string& identity, const Job& job) {
  std::string key = "gnsilu test_compile pass\n" + identity;
  key += "arch --gpu-architecture=sm_" + std::to_string(job.arch) + "\n";
  key += "job " + job.label() + "\nnames";
  for (const auto& name : job.names) key += " " + name;
  return key + "\n";
}

// ---- compiling ------------------------------------------------------------------------------------------------------
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

std::vector<std::string> problems_of(const Summary& s, const std::vector<std::string>& names) {
  std::vector<std::string> problems;
  for (const auto& name : names)
    if (s.count(name) == 0) problems.push_back(name + ": no ptxas report");
  for (const auto& [name, k] : s) {
    if (std::find(names.begin(), names.end(), name) == names.end())
      problems.push_back(name + ": reported, but not a kernel asked for");
    if (k.registers < 0 || k.stack < 0) problems.push_back(name + ": incomplete report");
    if (k.stack != 0 || k.spill_stores != 0 || k.spill_loads != 0) problems.push_back(name + ": " + text_of(k));
  }
  return problems;
}

Compiled compile_names(int arch, const std::vector<std::string>& names, bool profile) {
  gnsilu::detail::CompileRequest request;
  request.arch = arch;
  request.extra_options = kExtraOptions;
  for (const auto& name : names) request.names.push_back(kPrefix + name);
  Compiled out;
  if (profile) {
    request.ptx_only = true;
    const auto started = std::chrono::steady_clock::now();
    gnsilu::detail::compile(request);
    out.front_end_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    request.ptx_only = false;
  }
  const auto started = std::chrono::steady_clock::now();
  const auto program = gnsilu::detail::compile(request);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::map<std::string, std::string> by_lowered;  // mangled -> short name expression
  for (std::size_t i = 0; i < names.size() && i < program.lowered_names.size(); ++i)
    by_lowered[program.lowered_names[i]] = names[i];
  for (const auto& [mangled, facts] : parse_report(program.log)) {
    const auto it = by_lowered.find(mangled);
    out.summary[it == by_lowered.end() ? mangled : it->second] = facts;
  }
  out.problems = problems_of(out.summary, names);
  return out;
}

// ---- what a machine remembers ---------------------------------------------------------------------------------------
std::string pass_file(const std::string& folder, const std::string& key) {
  gnsilu::detail::Fnv1a h;
  h.add(key);
  return folder + "/" + h.hex() + ".pass";
}

namespace {

std::string summary_lines(const Summary& s, const std::vector<std::string>& order) {
  std::string out;
  for (const auto& name : order) {
    const auto it = s.find(name);
    if (it == s.end()) continue;
    const KernelFacts& k = it->second;
    out += name + " " + std::to_string(k.registers) + " " + std::to_string(k.stack) + " " +
           std::to_string(k.spill_stores) + " " + std::to_string(k.spill_loads) + "\n";
  }
  return out;
}

// One "name registers stack stores loads" line; nothing when it is not one.
std::optional<std::pair<std::string, KernelFacts>> kernel_line(const std::string& line) {
  std::istringstream fields(line);
  std::string name, rest;
  KernelFacts k;
  if (!(fields >> name >> k.registers >> k.stack >> k.spill_stores >> k.spill_loads) || (fields >> rest))
    return std::nullopt;
  return std::make_pair(name, k);
}

std::string read_text(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  *ok = static_cast<bool>(in);
  std::stringstream whole;
  if (in) whole << in.rdbuf();
  return whole.str();
}

}  // namespace

std::optional<Summary> remembered(const std::string& folder, const std::string& key) {
  bool ok = false;
  const std::string text = read_text(pass_file(folder, key), &ok);
  const std::string marker = "---\n";
  if (!ok || text.size() < key.size() + marker.size() || text.compare(0, key.size(), key) != 0 ||
      text.compare(key.size(), marker.size(), marker) != 0)
    return std::nullopt;
  Summary s;
  std::istringstream lines(text.substr(key.size() + marker.size()));
  for (std::string line; std::getline(lines, line);) {
    const auto k = kernel_line(line);
    if (!k) return std::nullopt;
    s[k->first] = k->second;
  }
  if (s.empty()) return std::nullopt;
  return s;
}

std::optional<std::string> remember(const std::string& folder, const std::string& key, const Summary& s) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return "cannot create " + folder + ": " + ec.message();
  std::vector<std::string> order;
  for (const auto& [name, k] : s) order.push_back(name);
  if (auto problem =
          gnsilu::detail::write_file_atomically(pass_file(folder, key), key + "---\n" + summary_lines(s, order)))
    return pass_file(folder, key) + " " + *problem;
  return std::nullopt;
}

// ---- the committed record ------------------------------------------------------------------------------------------
const Summary* Record::find(const Job& job) const {
  const std::string label = job.label();
  for (const auto& r : jobs)
    if (r.arch == job.arch && r.label == label) return r.names == job.names ? &r.summary : nullptr;
  return nullptr;
}

std::optional<Record> read_record(const std::string& path, std::string* error) {
  bool ok = false;
  const std::string text = read_text(path, &ok);
  if (!ok) {
    *error = path + " cannot be read";
    return std::nullopt;
  }
  Record record;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  auto fail = [&](const std::string& why) {
    *error = path + ":" + std::to_string(number) + ": " + why;
    return std::nullopt;
  };
  enum { kStart, kIdentity, kBody } state = kStart;
  bool identity_ended = false;
  while (std::getline(lines, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    if (state == kStart) {
      if (line != "identity") return fail("expected 'identity'");
      state = kIdentity;
    } else if (state == kIdentity) {
      if (line == "end identity") {
        state = kBody;
        identity_ended = true;
      } else {
        record.identity += line + "\n";
      }
    } else if (line.rfind("archs ", 0) == 0) {
      std::istringstream items(line.substr(6));
      for (int a = 0; items >> a;) record.archs.push_back(a);
    } else if (line.rfind("job sm_", 0) == 0) {
      RecordJob job;
      job.label = line.substr(4);
      const std::string digits = job.label.substr(3, job.label.find(' ') - 3);
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
        return fail("a job line without an architecture");
      job.arch = std::stoi(digits);
      record.jobs.push_back(std::move(job));
    } else if (const auto k = kernel_line(line); k && !record.jobs.empty()) {
      RecordJob& job = record.jobs.back();
      if (!job.summary.emplace(k->first, k->second).second) return fail("a kernel twice in one job");
      job.names.push_back(k->first);
    } else {
      return fail("not a record line: " + line.substr(0, 80));
    }
  }
  if (!identity_ended) {
    *error = path + ": no identity block";
    return std::nullopt;
  }
  return record;
}

std::string record_text(const std::string& identity, const std::vector<int>& archs, const std::vector<Job>& jobs,
                        const std::vector<Summary>& summaries) {
  std::string out =
      "# gnsilu's compile record: ptxas' report of every kernel instantiation the library can launch, for every\n"
      "# architecture NVRTC offers from sm_75 up, compiled with the library's options under the identity below.\n"
      "# Written by tools/compile_all_archs.sh after every kernel passed (no stack frame, no spill) and every ptxas\n"
      "# class's siblings matched their representative; read by tests/kernels/test_compile.cpp, which accepts it\n"
      "# only where the identity and a job's kernel names are the tree's exactly, and then compiles a random sample\n"
      "# of its jobs itself and fails on any difference. Never edited by hand: remake it after a kernel change.\n"
      "identity\n" +
      identity + "end identity\narchs";
  for (int a : archs) out += " " + std::to_string(a);
  out += "\n";
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    out += "job " + jobs[i].label() + "\n";
    out += summary_lines(summaries[i], jobs[i].names);
  }
  return out;
}

std::optional<std::string> identity_difference(const std::string& recorded, const std::string& identity) {
  if (recorded == identity) return std::nullopt;
  std::istringstream a(recorded), b(identity);
  std::string la, lb;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(a, la));
    const bool gb = static_cast<bool>(std::getline(b, lb));
    if (!ga && !gb) return "the identities differ";
    if (!ga || !gb || la != lb)
      return "recorded '" + (ga ? la : std::string("(nothing)")) + "', this tree '" +
             (gb ? lb : std::string("(nothing)")) + "'";
  }
}

// ---- the sample -----------------------------------------------------------------------------------------------------
std::vector<std::size_t> choose_sample(const std::vector<Job>& jobs, std::size_t count, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::map<int, std::vector<std::size_t>> by_arch;
  for (std::size_t i = 0; i < jobs.size(); ++i) by_arch[jobs[i].arch].push_back(i);
  std::vector<std::size_t> chosen, rest;
  for (auto& [arch, indices] : by_arch) {
    std::uniform_int_distribution<std::size_t> pick(0, indices.size() - 1);
    const std::size_t p = pick(random);
    chosen.push_back(indices[p]);
    for (std::size_t j = 0; j < indices.size(); ++j)
      if (j != p) rest.push_back(indices[j]);
  }
  std::shuffle(rest.begin(), rest.end(), random);
  for (std::size_t i = 0; i < rest.size() && chosen.size() < count; ++i) chosen.push_back(rest[i]);
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

std::vector<std::string> differences(const Summary& recorded, const Summary& compiled) {
  std::vector<std::string> out;
  for (const auto& [name, k] : recorded) {
    const auto it = compiled.find(name);
    if (it == compiled.end())
      out.push_back(name + ": recorded (" + text_of(k) + "), not reported by this compile");
    else if (!(it->second == k))
      out.push_back(name + ": recorded " + text_of(k) + ", compiled " + text_of(it->second));
  }
  for (const auto& [name, k] : compiled)
    if (recorded.count(name) == 0) out.push_back(name + ": compiled (" + text_of(k) + "), not in the record");
  return out;
}

// ---- a run ----------------------------------------------------------------------------------------------------------
const char* source_name(Outcome::Source s) {
  switch (s) {
    case Outcome::Source::Compiled: return "compiled";
    case Outcome::Source::Remembered: return "remembered";
    case Outcome::Source::Recorded: return "recorded";
    case Outcome::Source::Verified: return "recorded and compiled again";
  }
  return "?";
}

std::vector<Outcome> run_jobs(const std::vector<Job>& jobs, const std::string& identity, const RunOptions& options) {
  using Source = Outcome::Source;
  std::vector<Outcome> out(jobs.size());
  std::vector<std::string> keys(jobs.size());
  std::vector<std::size_t> to_compile, recorded;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    keys[i] = job_key(identity, jobs[i]);
    if (!options.filtered && !options.pass_cache.empty()) {
      if (auto s = remembered(options.pass_cache, keys[i])) {
        out[i].source = Source::Remembered;
        out[i].summary = std::move(*s);
        continue;
      }
    }
    const Summary* r = options.filtered || options.record == nullptr ? nullptr : options.record->find(jobs[i]);
    if (r != nullptr) {
      out[i].source = Source::Recorded;
      out[i].summary = *r;
      recorded.push_back(i);
    } else {
      to_compile.push_back(i);
    }
  }
  std::vector<Job> candidates;
  for (std::size_t i : recorded) candidates.push_back(jobs[i]);
  for (std::size_t c : choose_sample(candidates, options.sample, options.seed)) {
    out[recorded[c]].source = Source::Verified;
    to_compile.push_back(recorded[c]);
  }
  std::stable_sort(to_compile.begin(), to_compile.end(),
                   [&](std::size_t a, std::size_t b) { return jobs[a].cost() > jobs[b].cost(); });

  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t n; (n = next++) < to_compile.size();) {
      const std::size_t i = to_compile[n];
      Outcome& o = out[i];
      try {
        Compiled c = compile_names(jobs[i].arch, jobs[i].names, options.profile);
        o.seconds = c.seconds;
        o.front_end_seconds = c.front_end_seconds;
        if (o.source == Source::Verified) {
          for (auto& d : differences(o.summary, c.summary)) o.problems.push_back("differs from the record: " + d);
        }
        o.summary = std::move(c.summary);
        o.problems.insert(o.problems.end(), c.problems.begin(), c.problems.end());
        if (o.problems.empty() && !options.filtered && !options.pass_cache.empty()) {
          if (auto note = remember(options.pass_cache, keys[i], o.summary)) o.cache_note = *note;
        }
      } catch (const gnsilu::CompileError& e) {
        o.error = std::string(e.what()) + "\noptions: " + e.options();
      } catch (const std::exception& e) {
        o.error = e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  const std::size_t workers = std::min<std::size_t>(std::max(1u, options.threads), to_compile.size());
  for (std::size_t w = 0; w < workers; ++w) pool.emplace_back(work);
  for (auto& t : pool) t.join();

  for (std::size_t i : recorded) {
    if (out[i].source == Source::Recorded) out[i].problems = problems_of(out[i].summary, jobs[i].names);
  }
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (out[i].source == Source::Remembered) out[i].problems = problems_of(out[i].summary, jobs[i].names);
  }
  return out;
}

}  // namespace gnsilu::test::compile_guard
