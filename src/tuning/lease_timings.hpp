// Every duration of the tuning lease protocol, in one place. The lease mechanics (claims, takeover of a dead or
// silent holder, renewal) live in cache/store and cache/lease; this is how long the tuning layer holds, renews and
// waits. A process that tunes a key claims its lease for `lease_seconds` and renews it every `heartbeat_seconds`
// while it times; a process that finds the lease held claims again (taking over a dead or silent holder) and
// reports the holder every `claim_every`, looks for the holder's entry every `poll_every`, and gives up after its
// wait: `warm_wait` for gnsilu-tune warm (WaitOptions' default, --wait there), `first_use_wait` on a call's first
// use (GNSILU_TUNE_WAIT_MS overrides it).
#pragma once

#include <chrono>

#include "cache/lease.hpp"

namespace gnsilu::detail {

struct LeaseTimings {
  using Seconds = std::chrono::duration<double>;
  Seconds lease_seconds{cache::kLeaseSeconds};               // 15 s: a claim lasts this long unless renewed
  Seconds heartbeat_seconds{cache::kLeaseHeartbeatSeconds};  // 3 s: the tuning process renews its claim this often
  Seconds claim_every = std::chrono::milliseconds(500);      // a waiting process claims again and reports this often
  Seconds poll_every = std::chrono::milliseconds(50);        // and looks for the holder's entry this often
  Seconds warm_wait = std::chrono::seconds(600);             // how long gnsilu-tune warm waits by default
  Seconds first_use_wait = std::chrono::milliseconds(3000);  // how long a call's first use waits (GNSILU_TUNE_WAIT_MS)
};

inline constexpr LeaseTimings kLeaseTimings{};  // the defaults above

}  // namespace gnsilu::detail
