#include "base/faults.hpp"

#include <atomic>

namespace gnsilu::detail {
namespace {

std::atomic<int> pending[2];

}  // namespace

void inject_fault(Fault fault, int count) { pending[static_cast<int>(fault)].store(count); }

bool take_fault(Fault fault) {
  std::atomic<int>& left = pending[static_cast<int>(fault)];
  int n = left.load(std::memory_order_relaxed);
  while (n > 0) {
    if (left.compare_exchange_weak(n, n - 1)) return true;
  }
  return false;
}

}  // namespace gnsilu::detail
