// Who holds a tuning lease, and whether that holder still lives. A lease row's owner is the holder's identity
// as text: the host name, the boot id and the pid namespace of its kernel, the process id and its start time (so
// that a reused pid is not taken for the holder), the thread, and when the lease was first taken. A process that
// finds a lease held on its own host, boot and pid namespace by a process that no longer runs takes it over at
// once (Store::claim); a holder elsewhere (a file on shared storage) renews its lease every kLeaseHeartbeatSeconds
// while it tunes, and a lease not renewed for kLeaseSeconds is taken over.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace gnsilu::cache {

constexpr double kLeaseSeconds = 15.0;          // a lease lasts this long unless renewed
constexpr double kLeaseHeartbeatSeconds = 3.0;  // a tuning process renews its leases this often

struct LeaseHolder {
  std::string host;       // gethostname()
  std::string boot_id;    // /proc/sys/kernel/random/boot_id ("" where unreadable)
  std::string pid_ns;     // readlink(/proc/self/ns/pid), e.g. "pid:[4026531836]" ("" where unreadable)
  int64_t pid = 0;
  uint64_t start_ticks = 0;  // field 22 of /proc/<pid>/stat: the process's start time since boot
  std::string thread;        // distinguishes the threads of one process
  double since = 0.0;        // Unix time the lease was first taken

  // This thread of this process, with since = now.
  static LeaseHolder self();
  // "host=...;boot=...;ns=...;pid=...;start=...;thread=...;since=..." (the lease's owner column).
  std::string text() const;
  // The holder written by text(), or nullopt for an owner in another form (older gnsilu, tests).
  static std::optional<LeaseHolder> parse(const std::string& owner);

  enum class Liveness { Alive, Dead, Unknown };
  // Alive or Dead for a holder on this host, boot and pid namespace (the process exists with its start time, or
  // not); Unknown elsewhere, where only the lease's expiry can tell. A holder on this host name with another boot
  // id is Dead (the machine rebooted since).
  Liveness liveness() const;
  bool same_process(const LeaseHolder& other) const;
  // "pid 1234 on host, since 12 s" for messages.
  std::string describe(double now) const;
};

// "pid 1234 on host, since 12 s" for a lease's owner column as stored; the column itself when it is in another form.
std::string describe_owner(const std::string& owner, double now);

// Seconds since the Unix epoch (the clock of leases' since and expiry columns).
double unix_now();

// The start time of process `pid` on this machine (field 22 of /proc/<pid>/stat), or nullopt where it does not run.
std::optional<uint64_t> process_start_ticks(int64_t pid);

}  // namespace gnsilu::cache
