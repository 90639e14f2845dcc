#include "base/counters.hpp"

#include "base/process_lifetime.hpp"

namespace gnsilu::detail {

// Read by threads and exit handlers until the end (immortal).
Counters& counters() { return immortal<Counters>(); }

}  // namespace gnsilu::detail
