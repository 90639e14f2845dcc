// The CPU reference: kernels/gnsilu_math.cuh's arithmetic in the order the kernels apply it. Where the GPU
// has a warp, this file has arrays of 32 lanes and the same butterfly, so the bits agree. It reads each chunk's
// elements through the layout (Indexer), so both layouts give the same records by construction.
#include "gnsilu/reference.hpp"

#include <algorithm>
#include <thread>
#include <vector>

#include "kernels/gnsilu_math.cuh"
#include "runtime/validate.hpp"

namespace gnsilu {
namespace {

using namespace math;

// The warp butterfly: after the level that adds lane l ^ h, lanes l and l ^ h agree, so lane 0's value is
// w[0] + w[h] at each level (addition commutes bit for bit).
template <typename T>
T butterfly(T (&w)[kLanes]) {
  for (int h = kLanes / 2; h >= 1; h /= 2) {
    for (int l = 0; l < h; ++l) w[l] = w[l] + w[l + h];
  }
  return w[0];
}

// The record of a chunk of n values (in chunk order: element i of the chunk is v[i]).
template <int XT>
ChunkRecord chunk_record(const float (&v)[kChunk], int n) {
  float lanes[kLanes];
  float top = 0.0f;
  for (int lane = 0; lane < kLanes; ++lane) {
    float part[kSlots];
    for (int s = 0; s < kSlots; ++s) {
      float a[kVec];
      for (int e = 0; e < kVec; ++e) {
        const float value = v[(lane + kLanes * s) * kVec + e];
        a[e] = value;
        if constexpr (Scaling<XT>::kScaled) top = max_abs(top, value);
      }
      part[s] = tree8(a);
    }
    lanes[lane] = tree_slots(part[0], part[1], part[2], part[3]);
  }
  const Pivot pivot = chunk_pivot<XT>(butterfly(lanes), top, n);

  double lanes_r[kLanes];
  double lanes_q[kLanes];
  for (int lane = 0; lane < kLanes; ++lane) {
    double pr[kSlots];
    double pq[kSlots];
    for (int s = 0; s < kSlots; ++s) {
      float d[kVec];
      float dd[kVec];
      for (int e = 0; e < kVec; ++e) {
        const int i = (lane + kLanes * s) * kVec + e;
        d[e] = i < n ? centred(v[i], pivot) : 0.0f;
        dd[e] = d[e] * d[e];
      }
      pr[s] = static_cast<double>(tree8(d));
      pq[s] = static_cast<double>(tree8(dd));
    }
    lanes_r[lane] = tree_slots(pr[0], pr[1], pr[2], pr[3]);
    lanes_q[lane] = tree_slots(pq[0], pq[1], pq[2], pq[3]);
  }
  ChunkRecord r;
  r.r = butterfly(lanes_r);
  r.c = pivot.c;
  r.q = butterfly(lanes_q);
  r.e = pivot.e;
  r.n = n;
  r.unused = 0;
  return r;
}

// Partial p of 256 adds records p, p + 256, ... in order; then partial i += partial i + h for h = 128 ... 1.
template <typename Term>
double partials(i64 count, Term term) {
  double part[kPartials] = {};
  for (i64 j = 0; j < count; ++j) {
    double& p = part[j % kPartials];
    p = p + term(j);
  }
  for (int h = kPartials / 2; h >= 1; h /= 2)
    for (int i = 0; i < h; ++i) part[i] = part[i] + part[i + h];
  return part[0];
}

GroupStats combine(const std::vector<ChunkRecord>& records, i64 length, double eps) {
  const i64 count = static_cast<i64>(records.size());
  int max_e = -1000;
  for (const auto& r : records) max_e = std::max(max_e, r.e);
  const auto at = [&](i64 j) -> const ChunkRecord& { return records[static_cast<std::size_t>(j)]; };
  const double sum = partials(count, [&](i64 j) { return record_sum(at(j)); });
  const double mean = div64(sum, static_cast<double>(length));
  const double squares = partials(count, [&](i64 j) { return record_squares(at(j), mean); });
  return group_stats(sum, squares, length, max_e, eps);
}

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
  std::vector<ChunkRecord> records(static_cast<std::size_t>(g.chunks_per_group));
  float values[kChunk];
  for (i64 group = first; group < last; ++group) {
    const i64 sample = group / g.g;
    const i64 first_channel = (group - sample * g.g) * g.channels_per_group;
    for (i64 j = 0; j < g.chunks_per_group; ++j) {
      // The chunk's elements in chunk order (channel-major within the chunk), wherever they lie in memory.
      const ChunkPlace place = chunk_place(g.s, g.channels_per_group, j);
      int n = 0;
      for (i64 k = 0; k < place.channels; ++k) {
        for (i64 q = 0; q < place.pixels; ++q) {
          values[n++] = load_element<XT>(p.x, at(sample, first_channel + place.first_channel + k, place.first_pixel + q));
        }
      }
      for (int i = n; i < kChunk; ++i) values[i] = 0.0f;
      records[static_cast<std::size_t>(j)] = chunk_record<XT>(values, n);
    }
    const GroupStats stats = combine(records, g.group_length, p.eps);
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
