// A test case that cannot run on this machine (one GPU where it needs two, too little memory):
// GNSILU_SKIP_CASE(why) says why and returns from the case; run_cases() (the program's main) then exits 77 when
// every test case it ran skipped itself. Such a case is registered in ctest on its own (tests/CMakeLists.txt), so
// ctest reports it Skipped, never Passed. The program registers the listener once:
//   REGISTER_LISTENER("case-counter", 1, testing::CaseCounter);
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace testing {

// The test cases that skipped themselves, with why.
inline std::vector<std::string>& skipped_cases() {
  static std::vector<std::string> cases;
  return cases;
}

// How many test cases passed the filters of this run (a doctest listener fills it in at the end of the run).
inline unsigned& cases_run() {
  static unsigned n = 0;
  return n;
}

struct CaseCounter : doctest::IReporter {
  explicit CaseCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override { cases_run() = stats.numTestCasesPassingFilters; }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

// doctest's run, then 77 where every test case that ran skipped itself (and nothing failed).
inline int run_cases(doctest::Context& context) {
  const int result = context.run();
  const auto& skipped = skipped_cases();
  if (!skipped.empty()) {
    std::printf("%zu of %u test cases skipped themselves:\n", skipped.size(), cases_run());
    for (const auto& s : skipped) std::printf("  SKIPPED: %s\n", s.c_str());
  }
  if (result == 0 && !skipped.empty() && skipped.size() == cases_run()) return 77;
  return result;
}

}  // namespace testing

// In a test case: records the skip with its reason and returns from the case.
#define GNSILU_SKIP_CASE(why)                                                                        \
  do {                                                                                               \
    std::string gnsilu_skip_reason_ = std::string(doctest::getContextOptions()->currentTest != nullptr \
                                                      ? doctest::getContextOptions()->currentTest->m_name \
                                                      : "?") +                                       \
                                      ": " + (why);                                                  \
    MESSAGE("SKIPPED (this case): " << gnsilu_skip_reason_);                                         \
    testing::skipped_cases().push_back(gnsilu_skip_reason_);                                         \
    return;                                                                                          \
  } while (0)
