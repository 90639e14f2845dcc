// The CPU reference: a group's exact sums (kernels/gnsilu_exact.cuh), its statistics rounded once from them, and
// kernels/gnsilu_math.cuh's per-element arithmetic. The sums are exact, so adding the elements in any order gives
// the GPU's records; the elements are read through the layout (Indexer), so both layouts agree by construction.
#include "gnsilu/reference.hpp"

#include <algorithm>
#include <thread>
#include <vector>

#include "kernels/gnsilu_exact.cuh"
#include "kernels/gnsilu_math.cuh"
#include "runtime/validate.hpp"

namespace gnsilu {
namespace {

using namespace math;

// Where element (sample, channel, pixel) of the logical tensor lies in memory.
struct Indexer {
  i64 c, s;
  bool channels_last;
  i64 operator()(i64 sample, i64 channel, i64 pixel) const {
    return channels_last ? (sample * s + pixel) * c + channel : (sample * c + channel) * s + pixel;
  }
};

template <int XT, int YT, int ACT>
void run_groups(const Problem& p, const detail::Geometry& g, i64 first, i64 last) {
  const Indexer at{g.c, g.s, g.layout == Layout::ChannelsLast};
  for (i64 group = first; group < last; ++group) {
    const i64 sample = group / g.g;
    const i64 first_channel = (group - sample * g.g) * g.channels_per_group;
    // The group's exact sums, element by element (any order gives the same record).
    exact::Record record;
    exact::clear(record);
    const auto sink = exact::sink_of(record);
    exact::Accumulator acc;
    exact::acc_clear(acc);
    i64 added = 0;
    for (i64 k = 0; k < g.channels_per_group; ++k) {
      for (i64 q = 0; q < g.s; ++q) {
        exact::acc_add_element(acc, bits_of(load_element<XT>(p.x, at(sample, first_channel + k, q))), sink);
        if ((++added & 0xFFFFF) == 0) exact::normalize(record);  // far within the 2^31 additions a record takes
      }
    }
    exact::acc_flush(acc, sink);
    exact::Scratch scratch;
    const GroupStats stats = exact::group_stats(record, p.eps, scratch);
    for (i64 k = 0; k < g.channels_per_group; ++k) {
      const i64 channel = first_channel + k;
      const RowConstants rc =
          row_constants(stats, load_parameter(p.weight, static_cast<int>(p.weight_dtype), channel, 1.0),
                        load_parameter(p.bias, static_cast<int>(p.bias_dtype), channel, 0.0));
      for (i64 q = 0; q < g.s; ++q) {
        const i64 i = at(sample, channel, q);
        store_element<YT>(p.y, i, transform<ACT>(load_element<XT>(p.x, i), rc));
      }
    }
  }
}

template <int XT, int YT, int ACT>
void run(const Problem& p, const detail::Geometry& g, unsigned threads) {
  const i64 groups = g.groups_total;
  const i64 workers = std::max<i64>(1, std::min<i64>(threads, groups));
  if (workers == 1) {
    run_groups<XT, YT, ACT>(p, g, 0, groups);
    return;
  }
  std::vector<std::thread> pool;
  for (i64 w = 0; w < workers; ++w) {
    const i64 first = groups * w / workers;
    const i64 last = groups * (w + 1) / workers;
    pool.emplace_back([&p, &g, first, last] { run_groups<XT, YT, ACT>(p, g, first, last); });
  }
  for (auto& t : pool) t.join();
}

template <int XT, int YT>
void dispatch_activation(const Problem& p, const detail::Geometry& g, unsigned threads) {
  if (p.activation == Activation::None) run<XT, YT, kNoActivation>(p, g, threads);
  else run<XT, YT, kSiLU>(p, g, threads);
}

template <int XT>
void dispatch_y(const Problem& p, const detail::Geometry& g, unsigned threads) {
  switch (p.y_dtype) {
    case DType::BF16: return dispatch_activation<XT, kBF16>(p, g, threads);
    case DType::FP16: return dispatch_activation<XT, kFP16>(p, g, threads);
    default: return dispatch_activation<XT, kFP32>(p, g, threads);
  }
}

}  // namespace

void reference_group_norm_silu(const Problem& problem, unsigned threads) {
  const detail::Geometry g = detail::validate_problem(problem);
  if (g.numel == 0) return;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  switch (problem.x_dtype) {
    case DType::BF16: return dispatch_y<kBF16>(problem, g, threads);
    case DType::FP16: return dispatch_y<kFP16>(problem, g, threads);
    default: return dispatch_y<kFP32>(problem, g, threads);
  }
}

}  // namespace gnsilu
