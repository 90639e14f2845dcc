// The library's log: spdlog, to stderr as "[gnsilu warn] ...". Level from GNSILU_LOG_LEVEL: trace, debug, info,
// warn (the default), error, critical or off. Callers format with fmt (logger().warn("... {}", x)); spdlog itself is
// included only by log.cpp, so that a file that logs does not compile spdlog's headers (about 6 s a file).
#pragma once

#include <fmt/core.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace gnsilu::detail {

// spdlog's levels, in its order.
enum class LogLevel : int { Trace = 0, Debug, Info, Warn, Error, Critical, Off };

class Logger {
 public:
  bool enabled(LogLevel level) const;
  void write(LogLevel level, std::string_view message) const;

  template <typename... Args>
  void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) const {
    if (enabled(level)) write(level, fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void debug(fmt::format_string<Args...> format, Args&&... args) const {
    log(LogLevel::Debug, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void info(fmt::format_string<Args...> format, Args&&... args) const {
    log(LogLevel::Info, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) const {
    log(LogLevel::Warn, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void error(fmt::format_string<Args...> format, Args&&... args) const {
    log(LogLevel::Error, format, std::forward<Args>(args)...);
  }
};

// The one logger (usable during static destruction).
const Logger& logger();

// While one lives, every line the log writes at its level is also kept here: tests read what the library logged.
class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string text() const;

 private:
  struct Sink;
  std::shared_ptr<Sink> sink_;
};

}  // namespace gnsilu::detail
