#include "gpu.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <map>
#include <thread>

#include "tuning/config_table.hpp"
#include "base/driver.hpp"
#include "base/errors.hpp"
#include "common/random_fill.hpp"
#include "runtime/kernels.hpp"
#include "runtime/modules.hpp"
#include "runtime/plan.hpp"
#include "tuning/tuner.hpp"
#include "runtime/workspace.hpp"

namespace gnsilu::tune {
namespace {

using detail::driver;

// The tuner's inputs: normal(0.25, 1.5) of std::mt19937, a 4 MiB host pattern repeated over the buffer.
void fill_random(CUdeviceptr dst, std::size_t elements, DType dtype, uint32_t seed) {
  tools::fill_device(dst, elements, dtype, tools::NormalSpec{tools::Engine::Mt19937, seed, 0.25f, 1.5f},
                     std::size_t{4} << 20);
}

// Device memory for one tuning problem: x (the part the tuner reads), FP32 weight and bias of C values.
struct Inputs {
  detail::DeviceBuffer x, weight, bias;
  Problem problem;
  std::vector<int64_t> shape;
};

void make_inputs(const GpuSession& gpu, const std::vector<int64_t>& shape, int64_t groups, int64_t slice_numel,
                 DType x_dtype, DType y_dtype, Layout layout, Activation activation, Inputs& in) {
  in.shape = shape;
  const int64_t c = shape[1];
  in.x = detail::DeviceBuffer(gpu.context(), static_cast<std::size_t>(slice_numel) * dtype_size(x_dtype));
  in.weight = detail::DeviceBuffer(gpu.context(), static_cast<std::size_t>(c) * 4);
  in.bias = detail::DeviceBuffer(gpu.context(), static_cast<std::size_t>(c) * 4);
  fill_random(in.x.get(), static_cast<std::size_t>(slice_numel), x_dtype, 2026);
  fill_random(in.weight.get(), static_cast<std::size_t>(c), DType::FP32, 7);
  fill_random(in.bias.get(), static_cast<std::size_t>(c), DType::FP32, 11);
  in.problem = Problem{};
  in.problem.x = reinterpret_cast<const void*>(in.x.get());
  in.problem.x_dtype = x_dtype;
  in.problem.y_dtype = y_dtype;
  in.problem.shape = in.shape;
  in.problem.num_groups = groups;
  in.problem.weight = reinterpret_cast<const void*>(in.weight.get());
  in.problem.bias = reinterpret_cast<const void*>(in.bias.get());
  in.problem.x_layout = layout;
  in.problem.y_layout = layout;
  in.problem.activation = activation;
}

// The distinct programs among the candidate configurations (programs_per_sm does not change the code).
std::vector<LaunchConfig> distinct_codes() {
  std::vector<LaunchConfig> seen, out;
  for (const auto& c : candidate_configs()) {
    LaunchConfig code = c;
    code.programs_per_sm = 1;
    if (std::find(seen.begin(), seen.end(), code) != seen.end()) continue;
    seen.push_back(code);
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::unique_ptr<GpuSession> GpuSession::open(int ordinal, std::string& why) {
  if (!tools::gpu_present(why)) return nullptr;
  try {
    int count = 0;
    GNSILU_CHECK(driver().cuDeviceGetCount(&count));
    if (ordinal < 0 || ordinal >= count) {
      throw CliError(kUsage, "--device " + std::to_string(ordinal) + ": this machine has " + std::to_string(count) +
                                 " device(s)");
    }
    std::unique_ptr<GpuSession> s(new GpuSession);
    s->context_.emplace(ordinal);
    return s;
  } catch (const Error& e) {
    why = e.what();
    return nullptr;
  }
}

cache::DeviceIdentity GpuSession::identity() const { return detail::identity_of(info()); }

std::vector<WarmRow> keys_of(const GpuSession& gpu, const std::vector<ShapeRequest>& requests) {
  std::vector<WarmRow> rows;
  std::map<std::string, std::size_t> seen;
  for (const auto& r : requests) {
    const detail::Geometry g = geometry_of(r);
    if (g.numel == 0) continue;
    const Path path = detail::choose_path(g, Path::Auto, gpu.info().sms);
    WarmRow row;
    row.request = r;
    row.geometry = g;
    row.path = path;
    row.key = detail::tuning_key(gpu.info(), g, r.x, r.y, path, r.activation);
    if (seen.emplace(row.key.text(), rows.size()).second) rows.push_back(std::move(row));
  }
  return rows;
}

const char* outcome_name(detail::WarmResult::Outcome outcome) {
  using O = detail::WarmResult::Outcome;
  switch (outcome) {
    case O::Cached: return "cached";
    case O::Tuned: return "tuned";
    case O::TunedElsewhere: return "tuned by another process";
    case O::HeldByOther: return "busy";
    case O::Failed: return "failed";
    case O::NotFound: return "not found";
  }
  return "failed";
}

std::vector<WarmRow> warm(GpuSession& gpu, std::vector<WarmRow> rows, bool retune, double wait_seconds,
                          Progress& progress) {
  for (auto& row : rows) {
    const ShapeRequest& r = row.request;
    try {
      const detail::Geometry& g = row.geometry;
      const detail::TuningSlice slice = detail::tuning_slice_of(g, r.x, r.y);
      int64_t slice_numel = 1;
      for (auto d : slice.shape) slice_numel *= d;
      Inputs in;
      make_inputs(gpu, r.shape, r.groups, slice_numel, r.x, r.y, g.layout, r.activation, in);
      const detail::Call call{in.problem, g, gpu.info(), gpu.context(), nullptr, row.path};
      detail::WaitOptions wait;
      wait.wait_seconds = wait_seconds;
      double last_note = -10.0;
      wait.waiting = [&](const std::string& holder, double waited) {
        if (waited - last_note < 5.0) return;  // a line every 5 s
        last_note = waited;
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.0f of %.0f s", waited, wait_seconds);
        progress.note("waiting for another process tuning " + key_text(row.key) + " (" + holder + "): " + buf);
      };
      // Keyed once (keys_of) and sliced once (above): the tuning times the slice the inputs were made for.
      const detail::WarmResult w = detail::warm_key(call, row.key, slice, retune, wait);
      row.outcome = w.outcome;
      row.entry = w.entry;
      row.message = w.message;
      row.seconds = w.seconds;
      if (row.entry) {
        // The winner's kernels, compiled or from the cache, loaded on this device.
        detail::kernels_for(gpu.context(), gpu.info(),
                            detail::Variant{r.x, r.y, row.entry->winner, g.layout, r.activation});
      }
    } catch (const CliError&) {
      throw;
    } catch (const std::exception& e) {
      row.outcome = detail::WarmResult::Outcome::Failed;
      row.message = e.what();
    }
    std::string line = std::string(outcome_name(row.outcome)) + "  " + key_text(row.key) + "  (" + shape_text(r.shape) + ", " + r.origin + ")";
    if (row.entry) {
      char buf[128];
      std::snprintf(buf, sizeof buf, ": %s, %.1f us, %.2fx the default", config_text(row.entry->winner).c_str(),
                    row.entry->best_us, row.entry->best_us > 0 ? row.entry->default_us / row.entry->best_us : 1.0);
      line += buf;
    } else if (!row.message.empty()) {
      line += ": " + row.message;
    }
    progress.step(line);
  }
  return rows;
}

void add_unique(std::vector<KernelForm>& forms, const KernelForm& form) {
  if (std::find(forms.begin(), forms.end(), form) == forms.end()) forms.push_back(form);
}

std::size_t codes_per_form() { return distinct_codes().size(); }

std::size_t compile_all(const std::vector<int>& archs, const std::vector<KernelForm>& forms, Progress& progress) {
  struct Job {
    int arch;
    detail::Variant variant;
  };
  std::vector<Job> jobs;
  const std::vector<LaunchConfig> codes = distinct_codes();
  for (int arch : archs) {
    for (const auto& f : forms) {
      for (const auto& c : codes) jobs.push_back({arch, detail::Variant{f.pair.x, f.pair.y, c, f.layout, f.activation}});
    }
  }
  std::atomic<std::size_t> next{0};
  std::mutex report;
  std::string first_error;
  std::vector<std::thread> pool;
  const unsigned workers = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next++) < jobs.size();) {
        std::string line = "sm_" + std::to_string(jobs[i].arch) + " " + detail::describe(jobs[i].variant);
        try {
          detail::compiled_for(jobs[i].arch, jobs[i].variant);
        } catch (const std::exception& e) {
          std::lock_guard lock(report);
          if (first_error.empty()) first_error = line + ": " + e.what();
          line += ": FAILED";
        }
        std::lock_guard lock(report);
        progress.step(line);
      }
    });
  }
  for (auto& t : pool) t.join();
  if (!first_error.empty()) throw CliError(kFailed, "compiling " + first_error);
  return jobs.size();
}

std::vector<VerifyRow> verify(GpuSession& gpu, const std::vector<cache::TuningEntry>& entries, int samples,
                              double tolerance, Progress& progress) {
  std::vector<VerifyRow> rows;
  for (const auto& e : entries) {
    VerifyRow row;
    row.entry = e;
    try {
      const std::vector<int64_t>& shape = e.tuned_shape.dims;
      const int64_t groups = e.tuned_shape.groups;
      if (shape.size() < 2 || groups <= 0) {
        throw CliError(kBadInput, shape.empty() ? std::string("the entry's tuned shape is not known (its file held text "
                                                              "that does not read as a shape)")
                                                : "the entry's tuned shape \"" + e.tuned_shape.text() + "\" cannot be used");
      }
      const Path path = e.tuned_shape.path;
      if (path != Path::Fused && path != Path::Split) {
        throw CliError(kBadInput, "the entry does not record the path it was tuned on");
      }
      const detail::Geometry g = detail::make_geometry(shape, groups, e.key.layout);
      Inputs in;
      make_inputs(gpu, shape, groups, g.numel, e.key.x_dtype, e.key.y_dtype, e.key.layout, e.key.activation, in);
      const LaunchConfig fallback = default_config(path);
      detail::GpuBackend backend(detail::Call{in.problem, g, gpu.info(), gpu.context(), nullptr, path}, fallback);
      backend.prepare(e.winner);
      backend.prepare(fallback);
      for (int i = 0; i < 2; ++i) {
        backend.time_us(e.winner);
        backend.time_us(fallback);
      }
      std::vector<double> w, d;
      for (int i = 0; i < samples; ++i) {
        w.push_back(backend.time_us(e.winner));
        d.push_back(backend.time_us(fallback));
      }
      row.winner_us = detail::median_of(w);
      row.default_us = detail::median_of(d);
      row.drift = e.best_us > 0 ? row.winner_us / e.best_us - 1.0 : 0.0;
      row.status = std::abs(row.drift) > tolerance ? "drift" : "ok";
    } catch (const std::exception& ex) {
      row.status = std::string("failed: ") + ex.what();
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s  %s: winner %s now %.1f us (cached %.1f us, %+.1f%%), default now %.1f us",
                  row.status.c_str(), key_text(e.key).c_str(), config_text(e.winner).c_str(), row.winner_us, e.best_us,
                  100.0 * row.drift, row.default_us);
    progress.step(buf);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace gnsilu::tune
