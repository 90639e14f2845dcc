#include "base/counters.hpp"

namespace gnsilu::detail {

Counters& counters() {
  static Counters* c = new Counters;  // never destroyed: read by threads and exit handlers until the end
  return *c;
}

}  // namespace gnsilu::detail
