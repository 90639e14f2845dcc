// Linked with one layer's objects and those of the layers below it only (tests/layers/CMakeLists.txt): that the
// link succeeds is the check. Running it prints which layer it is.
#include <cstdio>

int main() {
  std::printf("layer %s links with only the layers below it\n", GNSILU_LAYER);
  return 0;
}
