// gnsilu-tune report: every candidate's time per tuning key as bar charts (SVG, or HTML around it), and the
// subcommand that writes them.
#include "report.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "commands.hpp"
#include "commands_common.hpp"
#include "tune.hpp"

namespace gnsilu::tune {
namespace {

constexpr int kWidth = 900;
constexpr int kLabel = 150;  // width of the configuration labels
constexpr int kBarArea = 600;
constexpr int kRow = 18;
constexpr int kHeader = 44;

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

int chart_height(const cache::TuningEntry& e) { return kHeader + kRow * static_cast<int>(e.candidates.size()) + 12; }

// One key's chart as SVG elements, with its top at `y`.
std::string chart(const cache::TuningEntry& e, int y) {
  const LaunchConfig fallback = default_config(e.tuned_shape.path);
  double longest = 0;
  for (const auto& c : e.candidates) longest = std::max(longest, c.median_us);
  std::string s;
  s += "<g transform=\"translate(0," + std::to_string(y) + ")\">\n";
  s += "<text x=\"8\" y=\"16\" class=\"title\">" + escape(key_text(e.key)) + "</text>\n";
  s += "<text x=\"8\" y=\"34\" class=\"sub\">tuned on " + escape(e.tuned_shape.text()) + " · winner " +
       escape(config_text(e.winner)) + " at " + fmt("%.1f", e.best_us) + " us, default " + fmt("%.1f", e.default_us) +
       " us (" + fmt("%.2f", e.best_us > 0 ? e.default_us / e.best_us : 1.0) + "x) · noise " + fmt("%.1f", e.noise_us) +
       " us</text>\n";
  int row = 0;
  for (const auto& c : e.candidates) {
    const int top = kHeader + kRow * row++;
    const bool winner = c.config == e.winner, is_default = c.config == fallback;
    s += "<text x=\"" + std::to_string(kLabel - 6) + "\" y=\"" + std::to_string(top + 12) + "\" class=\"label\">" +
         escape(config_text(c.config)) + (is_default ? " (default)" : "") + "</text>\n";
    if (c.status != "ok" || c.median_us <= 0) {
      s += "<text x=\"" + std::to_string(kLabel + 4) + "\" y=\"" + std::to_string(top + 12) + "\" class=\"skip\">" +
           escape(c.status) + "</text>\n";
      continue;
    }
    const int w = std::max(1, static_cast<int>(kBarArea * c.median_us / longest));
    const char* cls = winner ? "win" : is_default ? "def" : "bar";
    s += "<rect x=\"" + std::to_string(kLabel) + "\" y=\"" + std::to_string(top + 2) + "\" width=\"" + std::to_string(w) +
         "\" height=\"" + std::to_string(kRow - 5) + "\" class=\"" + cls + "\"><title>" + escape(config_text(c.config)) +
         ": median " + fmt("%.2f", c.median_us) + " us, noise " + fmt("%.2f", c.noise_us) + " us, " +
         std::to_string(c.samples) + " samples</title></rect>\n";
    s += "<text x=\"" + std::to_string(kLabel + w + 4) + "\" y=\"" + std::to_string(top + 12) + "\" class=\"value\">" +
         fmt("%.1f us", c.median_us) + "</text>\n";
  }
  s += "</g>\n";
  return s;
}

const char* kStyle =
    "text{font-family:sans-serif;font-size:12px;fill:#222}.title{font-weight:bold;font-size:13px}"
    ".sub{fill:#555}.label{text-anchor:end}.value{fill:#333}.skip{fill:#a33;font-style:italic}"
    ".bar{fill:#9aa5b1}.def{fill:#4a78b5}.win{fill:#2e9a4c}";

std::string svg(const std::vector<cache::TuningEntry>& entries, const std::string& title, bool standalone) {
  int height = 40;
  for (const auto& e : entries) height += chart_height(e);
  std::string s;
  if (standalone) s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(kWidth) + "\" height=\"" +
       std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(kWidth) + " " + std::to_string(height) + "\">\n";
  s += "<style>" + std::string(kStyle) + "</style>\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"8\" y=\"24\" class=\"title\">" + escape(title) + " — green: winner, blue: default, grey: other "
       "candidates (median time per run, L2 flushed)</text>\n";
  int y = 40;
  for (const auto& e : entries) {
    s += chart(e, y);
    y += chart_height(e);
  }
  if (entries.empty()) s += "<text x=\"8\" y=\"60\">This cache holds no tuned entries.</text>\n";
  s += "</svg>\n";
  return s;
}

}  // namespace

std::string report_svg(const std::vector<cache::TuningEntry>& entries, const std::string& title) {
  return svg(entries, title, true);
}

std::string report_html(const std::vector<cache::TuningEntry>& entries, const std::string& title) {
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + escape(title) +
                  "</title>\n<style>body{font-family:sans-serif;margin:24px}td,th{padding:2px 10px;text-align:left}"
                  "</style></head><body>\n<h1>" + escape(title) + "</h1>\n";
  s += "<table><tr><th>key</th><th>layout</th><th>activation</th><th>winner</th><th>time (us)</th>"
       "<th>default (us)</th><th>speedup</th><th>tuned shape</th></tr>\n";
  for (const auto& e : entries) {
    s += "<tr><td>" + escape(key_text(e.key, false)) + "</td><td>" + escape(layout_name(e.key.layout)) + "</td><td>" +
         escape(activation_name(e.key.activation)) + "</td><td>" + escape(config_text(e.winner)) + "</td><td>" +
         fmt("%.1f", e.best_us) + "</td><td>" + fmt("%.1f", e.default_us) + "</td><td>" +
         fmt("%.2fx", e.best_us > 0 ? e.default_us / e.best_us : 1.0) + "</td><td>" + escape(e.tuned_shape.text()) +
         "</td></tr>\n";
  }
  s += "</table>\n" + svg(entries, title, false) + "</body></html>\n";
  return s;
}

int run_report(const ReportOptions& o) {
  std::string format = o.format;
  if (format.empty()) format = o.output.ends_with(".svg") ? "svg" : "html";
  if (format != "html" && format != "svg") throw CliError(kUsage, "--format must be html or svg");
  const std::string path = cache_path(o.common.cache);
  const auto entries = entries_of(path);
  const std::string title = "gnsilu tuning report: " + path;
  const std::string text = format == "svg" ? report_svg(entries, title) : report_html(entries, title);
  std::ofstream out(o.output, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw CliError(kFailed, o.output + ": cannot be written");
  return emit(o.common.json, {{"report", o.output}, {"format", format}, {"entries", entries.size()}},
              [&] { std::printf("wrote %s (%s, %zu keys)\n", o.output.c_str(), format.c_str(), entries.size()); });
}

}  // namespace gnsilu::tune
