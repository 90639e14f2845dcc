// Output helpers of gnsilu-tune: key and configuration text, the progress line,
// text tables, and emit: the one place a subcommand's result is printed, as JSON or as text.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>

#include "base/names.hpp"
#include "cache/cache.hpp"
#include "cache/entries.hpp"
#include "tune.hpp"

namespace gnsilu::tune {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string clock_text(double seconds) {
  const auto s = std::llround(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

}  // namespace

std::string cache_path(const std::string& option) {
  if (!option.empty()) return option;
  return cache::settings_from_environment().user_path;
}

std::string config_text(const LaunchConfig& c) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "e%d w%d s%d p%d", c.elems_per_load, c.warps, c.stages, c.programs_per_sm);
  return buf;
}

std::string key_text(const cache::TuningKey& k, bool form) {
  return k.device.name + " sm" + std::to_string(k.device.arch) + " | cpg" + std::to_string(k.channels_per_group) + " " +
         dtype_name(k.x_dtype) + ">" + dtype_name(k.y_dtype) +
         (form ? std::string(" ") + layout_name(k.layout) + " " + activation_name(k.activation) : std::string()) +
         " | " + k.size_class;
}

std::string layout_text(Layout layout) {
  return std::string(layout_name(layout)) + (layout == Layout::ChannelsLast ? " (channels-last)" : " (channels-first)");
}

std::string activation_text(Activation activation) {
  return std::string(activation_name(activation)) +
         (activation == Activation::None ? " (plain GroupNorm)" : " (GroupNorm+SiLU)");
}

Progress::Progress(std::size_t total, bool enabled)
    : total_(total), enabled_(enabled), terminal_(isatty(STDERR_FILENO) != 0), started_(now_seconds()) {}

Progress::~Progress() {
  if (enabled_ && terminal_) std::fprintf(stderr, "\r\033[K");
}

void Progress::draw(const std::string& current) {
  const double elapsed = now_seconds() - started_;
  const int width = 24;
  const int filled = total_ ? static_cast<int>(width * done_ / total_) : width;
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(static_cast<std::size_t>(width), '.');
  std::string eta = "--:--";
  if (done_ > 0 && done_ < total_) eta = clock_text(elapsed / static_cast<double>(done_) * static_cast<double>(total_ - done_));
  if (done_ == total_) eta = "0:00";
  std::fprintf(stderr, "\r\033[K[%s] %zu/%zu  %s elapsed, ETA %s  %s", bar.c_str(), done_, total_,
               clock_text(elapsed).c_str(), eta.c_str(), current.substr(0, 60).c_str());
  std::fflush(stderr);
}

void Progress::step(const std::string& line) {
  ++done_;
  if (!enabled_) return;
  if (terminal_) {
    std::fprintf(stderr, "\r\033[K%s\n", line.c_str());
    draw("");
  } else {
    std::fprintf(stderr, "[%zu/%zu] %s\n", done_, total_, line.c_str());
  }
}

void Progress::note(const std::string& line) {
  if (!enabled_) return;
  if (terminal_) {
    std::fprintf(stderr, "\r\033[K%s\n", line.c_str());
    draw("");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

int emit(bool json, const nlohmann::json& result, const PrintText& text, int code) {
  if (json) {
    std::printf("%s\n", result.dump(2).c_str());
  } else {
    text();
  }
  return code;
}

}  // namespace gnsilu::tune
