// Every kernel variant (9 dtype pairs x every candidate configuration x both layouts x both activations)
// compiles with NVRTC for every architecture this NVRTC supports from sm_75 up, with no stack frame and no
// register spills (ptxas' report). NVRTC needs no GPU, so this runs in CI. GNSILU_TEST_ARCHS=90,100 narrows the
// architectures (for a quick look while developing; CI runs them all).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "runtime/compiler.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/kernels.hpp"

namespace {

struct Report {
  int arch = 0;
  std::size_t kernels = 0;
  int max_registers = 0;
  std::vector<std::string> problems;
  double seconds = 0;
};

Report compile_arch(int arch) {
  using gnsilu::DType;
  std::vector<gnsilu::detail::Variant> variants;
  for (DType x : {DType::BF16, DType::FP16, DType::FP32})
    for (DType y : {DType::BF16, DType::FP16, DType::FP32})
      for (const auto& c : gnsilu::candidate_configs())
        for (auto layout : {gnsilu::Layout::ChannelsFirst, gnsilu::Layout::ChannelsLast})
          for (auto activation : {gnsilu::Activation::SiLU, gnsilu::Activation::None})
            variants.push_back({x, y, c, layout, activation});
  Report r;
  r.arch = arch;
  const auto started = std::chrono::steady_clock::now();
  const auto program = gnsilu::detail::compile_variants(arch, variants, {"--ptxas-options=-v"});
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::regex frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  const std::regex registers(R"(Used (\d+) registers)");
  std::istringstream log(program.log);
  std::string line, function;
  while (std::getline(log, line)) {
    std::smatch m;
    if (line.find("Function properties for ") != std::string::npos) {
      function = line.substr(line.find("Function properties for ") + 24);
    } else if (std::regex_search(line, m, frame)) {
      ++r.kernels;
      if (m[1] != "0" || m[2] != "0" || m[3] != "0") r.problems.push_back(function + ": " + m[0].str());
    } else if (std::regex_search(line, m, registers)) {
      r.max_registers = std::max(r.max_registers, std::stoi(m[1]));
    }
  }
  const std::set<std::string> unique(program.lowered_names.begin(), program.lowered_names.end());
  if (r.kernels != unique.size()) {
    r.problems.push_back("ptxas reported " + std::to_string(r.kernels) + " kernels, expected " + std::to_string(unique.size()));
  }
  return r;
}

}  // namespace

TEST_CASE("every kernel variant compiles for every supported architecture without spills") {
  std::vector<int> archs;
  for (int a : gnsilu::detail::supported_archs())
    if (a >= 75) archs.push_back(a);
  for (int needed : {75, 80, 86, 89, 90}) {
    CHECK_MESSAGE(std::find(archs.begin(), archs.end(), needed) != archs.end(), "NVRTC lacks sm_" << needed);
  }
  if (const char* only = std::getenv("GNSILU_TEST_ARCHS"); only != nullptr && *only != '\0') {
    std::set<int> wanted;
    std::istringstream list(only);
    for (std::string item; std::getline(list, item, ',');) wanted.insert(std::stoi(item));
    std::erase_if(archs, [&](int a) { return wanted.count(a) == 0; });
    MESSAGE("GNSILU_TEST_ARCHS=" << only << ": " << archs.size() << " architectures");
  }
  std::vector<Report> reports(archs.size());
  std::vector<std::string> errors;
  std::mutex mutex;
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  const unsigned workers = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 4));
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next++) < archs.size();) {
        try {
          reports[i] = compile_arch(archs[i]);
        } catch (const gnsilu::CompileError& e) {
          std::lock_guard lock(mutex);
          errors.push_back("sm_" + std::to_string(archs[i]) + ": " + e.what() + "\noptions: " + e.options());
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  for (const auto& e : errors) FAIL_CHECK(e);
  for (const auto& r : reports) {
    if (r.arch == 0) continue;
    MESSAGE("sm_" << r.arch << ": " << r.kernels << " kernels, at most " << r.max_registers << " registers, " << r.seconds << " s");
    CHECK(r.kernels > 0);
    for (const auto& p : r.problems) FAIL_CHECK("sm_" << r.arch << " " << p);
  }
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
