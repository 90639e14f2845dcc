// gnsilu-tune report: every candidate's time per tuning key as bar charts, in one SVG image or an HTML page.
#pragma once

#include <string>
#include <vector>

#include "cache/entries.hpp"

namespace gnsilu::tune {

std::string report_svg(const std::vector<cache::TuningEntry>& entries, const std::string& title);
std::string report_html(const std::vector<cache::TuningEntry>& entries, const std::string& title);

}  // namespace gnsilu::tune
