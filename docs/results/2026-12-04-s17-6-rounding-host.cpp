// How much serial work thread 0 does after a group's sums are combined: stats_from_sums (the fast route) and
// group_stats (the record route), timed on the host CPU (the same GNSILU_HD code the kernels run).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "kernels/gnsilu_exact.cuh"
namespace ex = gnsilu::exact;
static unsigned bits(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
int main() {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.3f, 1.7f);
  std::vector<float> v(65536);
  for (auto& f : v) f = nd(rng);
  ex::Record record; ex::clear(record);
  const auto sink = ex::sink_of(record);
  ex::Accumulator acc; ex::acc_clear(acc);
  for (float f : v) ex::acc_add_element(acc, bits(f), sink);
  const int N = 200000;
  double sink_d = 0; int ok = 0;
  auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < N; ++i) { gnsilu::math::GroupStats s; ok += ex::stats_from_sums(acc, 1e-6 + i * 1e-30, s); sink_d += s.rstd; }
  double fast = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() / N * 1e9;
  ex::Record whole = record; ex::acc_flush(acc, ex::sink_of(whole));
  ex::Scratch scratch;
  t = std::chrono::steady_clock::now();
  for (int i = 0; i < N; ++i) { ex::Record r = whole; auto s = ex::group_stats(r, 1e-6 + i * 1e-30, scratch); sink_d += s.rstd; }
  double slow = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() / N * 1e9;
  std::printf("stats_from_sums %.0f ns (decided %d/%d), group_stats(record) %.0f ns  [%g]\n", fast, ok, N, slow, sink_d);
}
