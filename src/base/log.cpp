#include "base/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <memory>

#include "base/process_lifetime.hpp"

namespace gnsilu::detail {

spdlog::logger& logger() {
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

}  // namespace gnsilu::detail
