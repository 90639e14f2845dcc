// The base layer's byte helpers that the export format stands on: base64 (RFC 4648 test vectors, every length
// round-tripped, malformed text refused) and atomic file writes (new file, replacement, no temporary file left,
// the problems reported when the file cannot be created or replaced).
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cache/transfer/atomic_file.hpp"
#include "cache/transfer/base64.hpp"
#include "temp_dir.hpp"

using gnsilu::detail::base64_decode;
using gnsilu::detail::base64_encode;
using gnsilu::detail::write_file_atomically;
namespace fs = std::filesystem;

namespace {

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("base64: the RFC 4648 test vectors, both ways") {
  const std::pair<std::string, std::string> vectors[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    CAPTURE(plain);
    CHECK(base64_encode(bytes(plain)) == encoded);
    std::vector<char> out{'x'};
    REQUIRE(base64_decode(encoded, out));
    CHECK(out == bytes(plain));
  }
}

TEST_CASE("base64: every byte value and every length up to 300 round-trip") {
  std::vector<char> all;
  for (int n = 0; n <= 300; ++n) {
    CAPTURE(n);
    const std::string text = base64_encode(all);
    CHECK(text.size() == (all.size() + 2) / 3 * 4);
    std::vector<char> back;
    REQUIRE(base64_decode(text, back));
    CHECK(back == all);
    all.push_back(static_cast<char>(n * 37 % 256));
  }
}

TEST_CASE("base64: malformed text is refused") {
  std::vector<char> out;
  CHECK_FALSE(base64_decode("Zg=", out));       // not a multiple of 4
  CHECK_FALSE(base64_decode("Zm9v!A==", out));  // outside the alphabet
  CHECK_FALSE(base64_decode("Zg==Zm9v", out));  // padding before the end
  CHECK_FALSE(base64_decode("Z===", out));      // padding in the second place
  CHECK_FALSE(base64_decode("Zm=v", out));      // data after padding
  CHECK_FALSE(base64_decode("Zm9 ", out));      // no whitespace
}

TEST_CASE("write_file_atomically: creates, replaces, leaves no temporary file") {
  const testing::TempDir dir("base-io");
  const std::string path = dir.file("out.json");
  CHECK_FALSE(write_file_atomically(path, "first\n"));
  CHECK(contents(path) == "first\n");
  const std::string binary("a\0b\xff", 4);
  CHECK_FALSE(write_file_atomically(path, binary));
  CHECK(contents(path) == binary);
  CHECK_FALSE(write_file_atomically(path, ""));
  CHECK(fs::file_size(path) == 0);
  int files = 0;
  for (const auto& f : fs::directory_iterator(dir.path)) {
    ++files;
    CHECK(f.path().string().find(".tmp") == std::string::npos);
  }
  CHECK(files == 1);
}

TEST_CASE("write_file_atomically: the problem when the file cannot be created or replaced") {
  const testing::TempDir dir("base-io");
  SUBCASE("a folder that does not exist") {
    const std::string path = dir.file("missing/out.json");
    const auto problem = write_file_atomically(path, "x");
    REQUIRE(problem);
    CHECK(*problem == "cannot be created (" + path + ".tmp" + std::to_string(getpid()) +
                          " could not be opened for writing)");
  }
  SUBCASE("a folder in the way") {
    const std::string path = dir.file("taken");
    fs::create_directory(path);
    std::ofstream(dir.file("taken/inside")) << "keep";
    const auto problem = write_file_atomically(path, "x");
    REQUIRE(problem);
    CHECK(*problem == "cannot be replaced (rename failed)");
    CHECK(fs::is_directory(path));
    CHECK_FALSE(fs::exists(path + ".tmp" + std::to_string(getpid())));  // removed
  }
}
