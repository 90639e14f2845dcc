#include "cache/lease.hpp"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

namespace gnsilu::cache {
namespace {

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_target(const char* path) {
  char buffer[256] = {};
  const ssize_t n = readlink(path, buffer, sizeof buffer - 1);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
}

// Fields may not hold the separators of text(); host names and the kernel's strings never do.
std::string clean(std::string s) {
  for (char& c : s)
    if (c == ';' || c == '=' || c == '\n') c = '_';
  return s;
}

}  // namespace

std::optional<uint64_t> process_start_ticks(int64_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the fields after the last ')' are plain.
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {  // field 3 (state) is the first after the ')'
    if (!(fields >> field)) return std::nullopt;
  }
  try {
    return std::stoull(field);
  } catch (...) {
    return std::nullopt;
  }
}

LeaseHolder LeaseHolder::self() {
  static const LeaseHolder process = [] {
    LeaseHolder h;
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    h.host = clean(name);
    h.boot_id = clean(first_line("/proc/sys/kernel/random/boot_id"));
    h.pid_ns = clean(link_target("/proc/self/ns/pid"));
    h.pid = getpid();
    h.start_ticks = process_start_ticks(h.pid).value_or(0);
    return h;
  }();
  LeaseHolder h = process;
  if (h.pid != getpid()) {  // a forked child: its own pid and start time
    h.pid = getpid();
    h.start_ticks = process_start_ticks(h.pid).value_or(0);
  }
  std::ostringstream thread;
  thread << std::hash<std::thread::id>{}(std::this_thread::get_id());
  h.thread = thread.str();
  h.since = unix_now();
  return h;
}

std::string LeaseHolder::text() const {
  std::ostringstream out;
  out.precision(17);
  out << "host=" << host << ";boot=" << boot_id << ";ns=" << pid_ns << ";pid=" << pid << ";start=" << start_ticks
      << ";thread=" << thread << ";since=" << since;
  return out.str();
}

std::optional<LeaseHolder> LeaseHolder::parse(const std::string& owner) {
  LeaseHolder h;
  int seen = 0;
  std::istringstream in(owner);
  std::string part;
  try {
    while (std::getline(in, part, ';')) {
      const auto eq = part.find('=');
      if (eq == std::string::npos) return std::nullopt;
      const std::string name = part.substr(0, eq), value = part.substr(eq + 1);
      if (name == "host") h.host = value;
      else if (name == "boot") h.boot_id = value;
      else if (name == "ns") h.pid_ns = value;
      else if (name == "pid") h.pid = std::stoll(value);
      else if (name == "start") h.start_ticks = std::stoull(value);
      else if (name == "thread") h.thread = value;
      else if (name == "since") h.since = std::stod(value);
      else return std::nullopt;
      ++seen;
    }
  } catch (...) {
    return std::nullopt;
  }
  if (seen != 7 || h.host.empty() || h.pid <= 0) return std::nullopt;
  return h;
}

LeaseHolder::Liveness LeaseHolder::liveness() const {
  const LeaseHolder me = self();
  if (host != me.host || me.boot_id.empty()) return Liveness::Unknown;
  if (boot_id != me.boot_id) return Liveness::Dead;  // this host has rebooted since the lease was taken
  if (pid_ns.empty() || pid_ns != me.pid_ns) return Liveness::Unknown;  // another container's pids
  const auto start = process_start_ticks(pid);
  return start && *start == start_ticks ? Liveness::Alive : Liveness::Dead;
}

bool LeaseHolder::same_process(const LeaseHolder& other) const {
  return host == other.host && boot_id == other.boot_id && pid_ns == other.pid_ns && pid == other.pid &&
         start_ticks == other.start_ticks;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string describe_owner(const std::string& owner, double now) {
  const auto holder = LeaseHolder::parse(owner);
  return holder ? holder->describe(now) : owner;
}

std::string LeaseHolder::describe(double now) const {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(0);
  out << "pid " << pid << " on " << host << ", since " << (now > since ? now - since : 0.0) << " s";
  return out.str();
}

}  // namespace gnsilu::cache
