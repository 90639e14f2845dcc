// The CPU reference: a group's exact sums (kernels/gnsilu_exact.cuh), its statistics rounded once from them, and
// kernels/gnsilu_math.cuh's per-element arithmetic. The sums are exact, so adding the elements in any order gives
// the GPU's records; the elements are read through the layout (Indexer), so both layouts agree by construction.
#include "gnsilu/reference.hpp"

#include <algorithm>
#include <thread>
#include <vector>

#include "kernels/gnsilu_exact.cuh"
#include "kernels/gnsilu_math.cuh"
#include "base/errors.hpp"
#include "runtime/validate.hpp"

namespace gnsilu {
namespace {

using namespace math;

static_assert(kStatsWords == exact::kRecordWords && sizeof(exact::Record) == kStatsWords * sizeof(int64_t),
              "the public statistics record is exact::Record");

// Where element (sample, channel, pixel) of the logical tensor lies in memory.
struct Indexer {
  i64 c, s;
  bool channels_last;
  i64 operator()(i64 sample, i64 channel, i64 pixel) const {
    return channels_last ? (sample * s + pixel) * c + channel : (sample * c + channel) * s + pixel;
  }
};

// What a run computes: statistics and output (the one-call operation), statistics only (written to `out`), or the
// output from given statistics (`in`).
struct Stages {
  const int64_t* in = nullptr;  // kStatsWords words per group, or null: the group's own statistics
  int64_t* out = nullptr;       // statistics only: kStatsWords words per group
};

// Element i of the tensor normalized: x's, plus its channel's input bias where there is one (math::add_in).
template <int XT>
float input_at(const Problem& p, i64 i, i64 channel) {
  const float x = load_element<XT>(p.x, i);
  return p.input_bias != nullptr ? add_in<XT>(x, load_element<XT>(p.input_bias, channel)) : x;
}

// Group `group`'s exact sums, element by element (any order gives the same record), normalized.
template <int XT>
exact::Record group_record(const Problem& p, const detail::Geometry& g, i64 group) {
  const Indexer at{g.c, g.s, g.layout == Layout::ChannelsLast};
  const i64 sample = group / g.g;
  const i64 first_channel = (group - sample * g.g) * g.channels_per_group;
  exact::Record record;
  exact::clear(record);
  const auto sink = exact::sink_of(record);
  exact::Accumulator acc;
  exact::acc_clear(acc);
  i64 added = 0;
  for (i64 k = 0; k < g.channels_per_group; ++k) {
    for (i64 q = 0; q < g.s; ++q) {
      exact::acc_add_element(acc, bits_of(input_at<XT>(p, at(sample, first_channel + k, q), first_channel + k)), sink);
      if ((++added & 0xFFFFF) == 0) exact::normalize(record);  // far within the 2^31 additions a record takes
    }
  }
  exact::acc_flush(acc, sink);
  exact::normalize(record);
  return record;
}

template <int XT, int YT, int ACT>
void run_groups(const Problem& p, const detail::Geometry& g, const Stages& stages, i64 first, i64 last) {
  const Indexer at{g.c, g.s, g.layout == Layout::ChannelsLast};
  for (i64 group = first; group < last; ++group) {
    exact::Record record;
    if (stages.in != nullptr) {
      std::copy_n(stages.in + group * kStatsWords, kStatsWords, &record.count);
    } else {
      record = group_record<XT>(p, g, group);
    }
    if (stages.out != nullptr) {
      std::copy_n(&record.count, kStatsWords, stages.out + group * kStatsWords);
      continue;
    }
    const i64 sample = group / g.g;
    const i64 first_channel = (group - sample * g.g) * g.channels_per_group;
    exact::Scratch scratch;
    const GroupStats stats = exact::group_stats(record, p.eps, scratch);
    for (i64 k = 0; k < g.channels_per_group; ++k) {
      const i64 channel = first_channel + k;
      const RowConstants rc =
          row_constants(stats, load_parameter(p.weight, static_cast<int>(p.weight_dtype), channel, 1.0),
                        load_parameter(p.bias, static_cast<int>(p.bias_dtype), channel, 0.0));
      if (g.padded()) {  // y = F.pad(output): every position of y, from the element of x it shows
        const Indexer out{g.c, g.pad.out_s, g.layout == Layout::ChannelsLast};
        for (i64 q = 0; q < g.pad.out_s; ++q) {
          i64 source = 0;
          const float v = padded_source(g.pad, q, source)
                              ? transform<ACT>(input_at<XT>(p, at(sample, channel, source), channel), rc)
                              : g.pad.value;
          store_element<YT>(p.y, out(sample, channel, q), v);
        }
        continue;
      }
      for (i64 q = 0; q < g.s; ++q) {
        const i64 i = at(sample, channel, q);
        store_element<YT>(p.y, i, transform<ACT>(input_at<XT>(p, i, channel), rc));
      }
    }
  }
}

template <int XT, int YT, int ACT>
void run(const Problem& p, const detail::Geometry& g, const Stages& stages, unsigned threads) {
  const i64 groups = g.groups_total;
  const i64 workers = std::max<i64>(1, std::min<i64>(threads, groups));
  if (workers == 1) {
    run_groups<XT, YT, ACT>(p, g, stages, 0, groups);
    return;
  }
  std::vector<std::thread> pool;
  for (i64 w = 0; w < workers; ++w) {
    const i64 first = groups * w / workers;
    const i64 last = groups * (w + 1) / workers;
    pool.emplace_back([&p, &g, &stages, first, last] { run_groups<XT, YT, ACT>(p, g, stages, first, last); });
  }
  for (auto& t : pool) t.join();
}

template <int XT, int YT>
void dispatch_activation(const Problem& p, const detail::Geometry& g, const Stages& stages, unsigned threads) {
  if (p.activation == Activation::None) run<XT, YT, kNoActivation>(p, g, stages, threads);
  else run<XT, YT, kSiLU>(p, g, stages, threads);
}

template <int XT>
void dispatch_y(const Problem& p, const detail::Geometry& g, const Stages& stages, unsigned threads) {
  switch (p.y_dtype) {
    case DType::BF16: return dispatch_activation<XT, kBF16>(p, g, stages, threads);
    case DType::FP16: return dispatch_activation<XT, kFP16>(p, g, stages, threads);
    default: return dispatch_activation<XT, kFP32>(p, g, stages, threads);
  }
}

void dispatch(const Problem& problem, const detail::Geometry& g, const Stages& stages, unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  switch (problem.x_dtype) {
    case DType::BF16: return dispatch_y<kBF16>(problem, g, stages, threads);
    case DType::FP16: return dispatch_y<kFP16>(problem, g, stages, threads);
    default: return dispatch_y<kFP32>(problem, g, stages, threads);
  }
}

}  // namespace

void reference_group_norm_silu(const Problem& problem, unsigned threads) {
  const detail::Geometry g = detail::validate_problem(problem);
  if (g.numel == 0) return;
  dispatch(problem, g, Stages{}, threads);
}

void reference_group_stats(const Problem& region, int64_t* stats, unsigned threads) {
  const detail::Geometry g = detail::validate_stats_problem(region);
  if (stats == nullptr) detail::throw_invalid("stats", "is null");
  if (g.groups_total == 0) return;
  Problem p = region;
  p.y = nullptr;  // never written: statistics only
  p.y_dtype = region.x_dtype;
  dispatch(p, g, Stages{nullptr, stats}, threads);
}

void reference_group_norm_apply(const Problem& problem, const int64_t* stats, unsigned threads) {
  const detail::Geometry g = detail::validate_problem(problem);
  if (stats == nullptr) detail::throw_invalid("stats", "is null");
  if (g.numel == 0) return;
  dispatch(problem, g, Stages{stats, nullptr}, threads);
}

}  // namespace gnsilu
