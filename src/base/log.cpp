#include "base/log.hpp"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "base/process_lifetime.hpp"

namespace gnsilu::detail {
namespace {

spdlog::logger& spd() {
  return immortal<spdlog::logger>([] {  // usable during static destruction
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto* l = new spdlog::logger("gnsilu", sink);
    l->set_pattern("[gnsilu %^%l%$] %v");
    spdlog::level::level_enum level = spdlog::level::warn;
    if (const char* env = std::getenv("GNSILU_LOG_LEVEL"); env != nullptr && *env != '\0') {
      level = spdlog::level::from_str(env);
    }
    l->set_level(level);
    return l;
  });
}

spdlog::level::level_enum level_of(LogLevel level) { return static_cast<spdlog::level::level_enum>(level); }

}  // namespace

bool Logger::enabled(LogLevel level) const { return spd().should_log(level_of(level)); }

void Logger::write(LogLevel level, std::string_view message) const {
  spd().log(level_of(level), spdlog::string_view_t(message.data(), message.size()));
}

const Logger& logger() {
  static const Logger one;  // no state, and a trivial destructor: usable during static destruction
  return one;
}

struct LogCapture::Sink {
  std::ostringstream out;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
};

LogCapture::LogCapture() : sink_(std::make_shared<Sink>()) { spd().sinks().push_back(sink_->sink); }

LogCapture::~LogCapture() {
  auto& sinks = spd().sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_->sink), sinks.end());
}

std::string LogCapture::text() const { return sink_->out.str(); }

}  // namespace gnsilu::detail
