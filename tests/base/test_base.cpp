// The base layer's shared idioms: values computed once per key while other threads wait, process-lifetime
// objects, and join.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/errors.hpp"
#include "base/names.hpp"
#include "base/process_lifetime.hpp"
#include "base/text.hpp"

using gnsilu::detail::ComputeOnce;

TEST_CASE("ComputeOnce: one computation per key; threads asking meanwhile wait and get its value") {
  ComputeOnce<int, std::string> once;
  std::atomic<int> computed{0};
  std::atomic<bool> release{false};
  std::vector<std::string> seen(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      seen[static_cast<std::size_t>(t)] = once.get(7, [&] {
        computed++;
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the others arrive meanwhile
        return ComputeOnce<int, std::string>::Computed{"seven"};
      });
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  release = true;
  for (auto& t : threads) t.join();
  CHECK(computed == 1);
  for (const auto& s : seen) CHECK(s == "seven");
  REQUIRE(once.find(7).has_value());
  CHECK(*once.find(7) == "seven");
  CHECK_FALSE(once.find(8).has_value());
  CHECK(once.get(7, [&] { computed++; return ComputeOnce<int, std::string>::Computed{"other"}; }) == "seven");
  CHECK(computed == 1);
}

TEST_CASE("ComputeOnce: a value not to keep, or a failure, leaves nothing behind") {
  ComputeOnce<int, int> once;
  CHECK(once.get(1, [] { return ComputeOnce<int, int>::Computed{10, false}; }) == 10);
  CHECK_FALSE(once.find(1).has_value());
  CHECK(once.get(1, [] { return ComputeOnce<int, int>::Computed{11}; }) == 11);  // computed again, now kept
  CHECK(*once.find(1) == 11);

  CHECK_THROWS_WITH_AS(once.get(2, []() -> ComputeOnce<int, int>::Computed { throw std::runtime_error("no"); }), "no",
                       std::runtime_error);
  CHECK_FALSE(once.find(2).has_value());
  CHECK(once.get(2, [] { return ComputeOnce<int, int>::Computed{20}; }) == 20);  // a later call tries again

  once.clear();
  CHECK_FALSE(once.find(1).has_value());
  CHECK_FALSE(once.find(2).has_value());
}

TEST_CASE("ComputeOnce: threads waiting on a computation that fails get its exception") {
  ComputeOnce<int, int> once;
  std::atomic<bool> release{false};
  std::atomic<int> failures{0}, computed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      try {
        once.get(3, [&]() -> ComputeOnce<int, int>::Computed {
          computed++;
          while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          throw std::runtime_error("compile failed");
        });
      } catch (const std::runtime_error& e) {
        if (std::string(e.what()) == "compile failed") failures++;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  release = true;
  for (auto& t : threads) t.join();
  CHECK(computed == 1);
  CHECK(failures == 4);
  CHECK_FALSE(once.find(3).has_value());
}

namespace {
struct Tally {
  int n = 0;
};
}  // namespace

TEST_CASE("immortal: one instance per type, and per call site when built by a function") {
  gnsilu::detail::immortal<Tally>().n++;
  gnsilu::detail::immortal<Tally>().n++;
  CHECK(gnsilu::detail::immortal<Tally>().n == 2);
  CHECK(&gnsilu::detail::immortal<Tally>() == &gnsilu::detail::immortal<Tally>());
  auto built = [] { return &gnsilu::detail::immortal<Tally>([] { return new Tally{40}; }); };
  CHECK(built()->n == 40);
  CHECK(built() == built());
  CHECK(built() != &gnsilu::detail::immortal<Tally>());
}

TEST_CASE("join") {
  using gnsilu::detail::join;
  CHECK(join({}, " ") == "");
  CHECK(join({"a"}, " ") == "a");
  CHECK(join({"--fmad=false", "-arch=sm_90"}, " ") == "--fmad=false -arch=sm_90");
  CHECK(join({"_Z1av", "_Z1bv", "_Z1cv"}, "\n") == "_Z1av\n_Z1bv\n_Z1cv");
}

TEST_CASE("driver and NVRTC errors name the source file by its folder and name, whatever path the compiler saw") {
  for (const char* path : {"/home/ci/clone/src/runtime/launch.cpp", "../src/runtime/launch.cpp", "runtime/launch.cpp"}) {
    try {
      gnsilu::detail::throw_cuda(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel", path, 43);
      FAIL("expected a CudaError");
    } catch (const gnsilu::Error& e) {
      const std::string message = e.what();
      CHECK_MESSAGE(message.find("cuLaunchKernel failed: ") == 8, message);
      CHECK_MESSAGE(message.ends_with(" at runtime/launch.cpp:43"), message);
    }
  }
  try {
    gnsilu::detail::throw_nvrtc(NVRTC_ERROR_COMPILATION, "nvrtcCompileProgram", "/x/src/runtime/compiler.cpp", 7);
    FAIL("expected an Error");
  } catch (const gnsilu::Error& e) {
    CHECK(std::string(e.what()).ends_with(" at runtime/compiler.cpp:7"));
  }
  try {
    gnsilu::detail::throw_nvrtc(NVRTC_ERROR_COMPILATION, "nvrtcCompileProgram", "compiler.cpp", 7);
    FAIL("expected an Error");
  } catch (const gnsilu::Error& e) {
    CHECK(std::string(e.what()).ends_with(" at compiler.cpp:7"));
  }
}

TEST_CASE("names: every enum's parser reads back its name function's names, and nothing else") {
  using namespace gnsilu;
  for (DType d : {DType::BF16, DType::FP16, DType::FP32}) CHECK(detail::dtype_from_name(dtype_name(d)) == d);
  for (Layout l : {Layout::ChannelsFirst, Layout::ChannelsLast}) CHECK(detail::layout_from_name(layout_name(l)) == l);
  for (Activation a : {Activation::SiLU, Activation::None}) {
    CHECK(detail::activation_from_name(activation_name(a)) == a);
  }
  for (Path p : {Path::Auto, Path::Fused, Path::Split}) CHECK(detail::path_from_name(path_name(p)) == p);
  CHECK(detail::dtype_from_name("fp16") == DType::FP16);
  CHECK(detail::layout_from_name("nhwc") == Layout::ChannelsLast);
  CHECK(detail::path_from_name("fused") == Path::Fused);
  for (const char* bad : {"", "BF16", "bf16 ", "none", "unknown", "fp64"}) CHECK_FALSE(detail::dtype_from_name(bad));
  for (const char* bad : {"", "NCHW", "channels_last", "unknown"}) CHECK_FALSE(detail::layout_from_name(bad));
  for (const char* bad : {"", "SiLU", "relu", "unknown"}) CHECK_FALSE(detail::activation_from_name(bad));
  for (const char* bad : {"", "Fused", "unknown"}) CHECK_FALSE(detail::path_from_name(bad));
}
