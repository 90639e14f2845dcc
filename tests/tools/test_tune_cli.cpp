// gnsilu-tune end to end without a GPU: help, argument errors and exit codes, compiling, export / import /
// merge round trips with conflicts, corrupt inputs, prune, report, and every --json output parsed back.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include <SQLiteCpp/SQLiteCpp.h>

#include "archs.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/kernels.hpp"
#include "cache/store.hpp"
#include "cache_samples.hpp"
#include "temp_dir.hpp"

using namespace gnsilu::cache;
using nlohmann::json;
namespace fs = std::filesystem;
using testing::TempDir;

namespace {

using testing::read_bytes;

struct Result {
  int code = -1;
  std::string out, err;
  json doc() const {
    json j = json::parse(out, nullptr, false);
    REQUIRE_MESSAGE(!j.is_discarded(), "not JSON: " << out << err);
    return j;
  }
};

// Runs gnsilu-tune with `args` (shell words) in `dir`, with no driver in reach: what CI machines have.
Result tune(const TempDir& dir, const std::string& args) {
  const std::string cmd = "cd '" + dir.path.string() + "' && env -u GNSILU_CACHE GNSILU_LIBCUDA=/nonexistent/libcuda.so.1 " +
                          "XDG_CACHE_HOME='" + dir.file("xdg") + "' '" GNSILU_TUNE_BINARY "' " + args + " > '" +
                          dir.file("stdout") + "' 2> '" + dir.file("stderr") + "'";
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_bytes(dir.file("stdout"));
  r.err = read_bytes(dir.file("stderr"));
  return r;
}

TuningKey key(int64_t cpg, const std::string& code, const std::string& device = "NVIDIA H200") {
  return testing::sample_key(cpg, code, device);
}

TuningEntry entry(const TuningKey& k, int warps, double noise) { return testing::sample_entry(k, {16, warps, 1, 4}, noise); }

const std::string& current() { return gnsilu::detail::code_version(); }

TuningKey with_form(TuningKey k, gnsilu::Layout layout, gnsilu::Activation activation) {
  k.layout = layout;
  k.activation = activation;
  return k;
}

// Stand-ins for the compiled kernels of every candidate code of one form for sm_90, in the cache file at `path`:
// what `compile` finds there instead of running NVRTC (nothing loads them without a GPU).
void fake_kernels(const std::string& path, gnsilu::DType x, gnsilu::DType y, gnsilu::Layout layout,
                  gnsilu::Activation activation) {
  Store s(path, Store::Mode::ReadWrite);
  REQUIRE(s.writable());
  for (const auto& c : gnsilu::candidate_configs()) {
    const gnsilu::detail::Variant v{x, y, c, layout, activation};
    KernelImage image;
    image.image = {'f', 'a', 'k', 'e'};
    image.lowered_names.assign(gnsilu::detail::kKernelCount, "stand-in");  // one name per kernel of a variant
    REQUIRE(s.put_kernel({90, current(), gnsilu::detail::code_name(v)}, image));
  }
}

bool has(const json& list, const std::string& name) {
  for (const auto& x : list)
    if (x == name) return true;
  return false;
}

}  // namespace

TEST_CASE("help for every subcommand; argument errors exit 2 with one line") {
  TempDir dir("tune-cli");
  for (const char* sub : {"", "warm", "compile", "list", "show", "export", "import", "merge", "verify", "prune", "report"}) {
    const Result r = tune(dir, std::string(sub) + " --help");
    CHECK_MESSAGE(r.code == 0, sub);
    CHECK_MESSAGE(r.out.find("Exit codes") != std::string::npos, sub);
  }
  for (const char* sub : {"warm", "compile"}) {
    const Result r = tune(dir, std::string(sub) + " --help");
    CHECK_MESSAGE(r.out.find("--layout") != std::string::npos, sub);
    CHECK_MESSAGE(r.out.find("--activation") != std::string::npos, sub);
    CHECK_MESSAGE(r.out.find("nhwc") != std::string::npos, sub);
  }
  CHECK(tune(dir, "warm --help").out.find("plain GroupNorm") != std::string::npos);
  CHECK(tune(dir, "--version").out.find("0.") != std::string::npos);
  struct Case {
    const char* args;
    const char* says;
  };
  for (const Case& c : {Case{"", "subcommand"}, Case{"frobnicate", "subcommand"}, Case{"warm", "nothing to warm"},
                        Case{"warm 1x512x0x4", "1x512x0x4"}, Case{"warm 1x512x64x64 --groups 7", "groups"},
                        Case{"warm 512", "at least N and C"}, Case{"warm --preset nope", "nope"},
                        Case{"warm --preset flux --resolution 1020", "multiple of 8"},
                        Case{"warm --preset hunyuan-video --frames 10", "4k + 1"},
                        Case{"warm 1x64x8x8 --dtype int8", "int8"}, Case{"compile", "--arch"},
                        Case{"compile --arch 70", "7.5"}, Case{"show", "id"}, Case{"report r.pdf --format pdf", "html or svg"},
                        Case{"verify --samples 1", "samples"}, Case{"warm --shapes-file missing.json", "missing.json"},
                        Case{"warm 1x64x8x8 --layout nchwx", "--layout: layout \"nchwx\""},
                        Case{"warm 1x64x8x8 --layout nchw,channels_lost", "--layout: layout \"channels_lost\""},
                        Case{"warm 1x64x8x8 --activation gelu", "--activation: activation \"gelu\""},
                        Case{"warm --preset flux --activation silu,relu", "--activation: activation \"relu\""},
                        Case{"compile --arch 90 --layout nhcw", "--layout: layout \"nhcw\""},
                        Case{"compile --activation swish", "--activation: activation \"swish\""}}) {
    const Result r = tune(dir, c.args);
    CHECK_MESSAGE(r.code == 2, std::string(c.args) << " -> " << r.code << ": " << r.err);
    CHECK_MESSAGE(r.err.find(c.says) != std::string::npos, std::string(c.args) << ": " << r.err);
    CHECK_MESSAGE(r.err.find("gnsilu-tune: ") == 0, r.err);
  }
}

TEST_CASE("compile and warm without a GPU fill the kernel cache, once") {
  using gnsilu::Activation;
  using gnsilu::DType;
  using gnsilu::Layout;
  TempDir dir("tune-cli");
  Result r = tune(dir, "compile --arch 90 --dtype bf16 --layout nchw --activation silu --cache c.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  json j = r.doc();
  CHECK(j["variants"] == 6);
  CHECK(j["compiled"] == 6);
  CHECK(j["layouts"] == json::array({"nchw"}));
  CHECK(j["activations"] == json::array({"silu"}));
  r = tune(dir, "compile --arch 90 --dtype bf16 --layout nchw --activation silu --cache c.sqlite --json");
  CHECK(r.doc()["compiled"] == 0);
  CHECK(r.doc()["from_cache"] == 6);
  // Channels-last plain GroupNorm, compiled by NVRTC too: its own programs, saved under their own names.
  r = tune(dir, "compile --arch 90 --dtype bf16 --layout channels-last --activation none --cache c.sqlite");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find("6 compiled") != std::string::npos);
  CHECK(r.err.find("bf16->bf16 nhwc none") != std::string::npos);
  {
    Store s(dir.file("c.sqlite"), Store::Mode::ReadOnly);
    int nhwc_none = 0, nchw_silu = 0;
    for (const auto& k : s.kernel_keys()) {
      nhwc_none += k.variant.ends_with("-nhwc-none");
      nchw_silu += k.variant.ends_with("-nchw-silu");
    }
    CHECK(nhwc_none == 6);
    CHECK(nchw_silu == 6);
  }
  // The two other forms of bf16 from stand-ins: by default compile goes through both layouts and both activations.
  fake_kernels(dir.file("c.sqlite"), DType::BF16, DType::BF16, Layout::ChannelsLast, Activation::SiLU);
  fake_kernels(dir.file("c.sqlite"), DType::BF16, DType::BF16, Layout::ChannelsFirst, Activation::None);
  r = tune(dir, "compile --arch 90 --dtype bf16 --cache c.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  j = r.doc();
  CHECK(j["variants"] == 24);
  CHECK(j["compiled"] == 0);
  CHECK(j["from_cache"] == 24);
  CHECK(j["layouts"] == json::array({"nchw", "nhwc"}));
  CHECK(j["activations"] == json::array({"silu", "none"}));
  // warm --preset flux with no GPU: compile only, for sm_90, saying why; both layouts, and the attention's plain
  // GroupNorm besides GroupNorm+SiLU.
  r = tune(dir, "warm --preset flux --dtype bf16 --cache c.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  j = r.doc();
  CHECK(j["mode"] == "compile");
  CHECK(j["compiled"] == 0);
  CHECK(j["variants"] == 24);
  CHECK(j["layouts"] == json::array({"nchw", "nhwc"}));
  CHECK(j["activations"] == json::array({"silu", "none"}));
  CHECK(j["note"].get<std::string>().find("no GPU here") != std::string::npos);
  r = tune(dir, "warm --preset flux --dtype bf16 --cache c.sqlite");
  CHECK(r.code == 0);
  CHECK(r.err.find("compiling kernels only") != std::string::npos);  // plain lines when piped
  CHECK(r.out.find("already in the cache") != std::string::npos);
  // Narrowed: one layout; --activation keeps only the preset shapes of the activations named.
  j = tune(dir, "warm --preset sdxl --dtype bf16 --layout nchw --cache c.sqlite --json").doc();
  CHECK(j["variants"] == 12);
  CHECK(j["layouts"] == json::array({"nchw"}));
  j = tune(dir, "warm --preset flux --dtype bf16 --activation none --cache c.sqlite --json").doc();
  CHECK(j["variants"] == 12);
  CHECK(j["activations"] == json::array({"none"}));
  j = tune(dir, "warm --preset hunyuan-video --part decoder --dtype bf16 --layout ndhwc --activation silu,none "
                "--cache c.sqlite --json").doc();
  CHECK(j["variants"] == 12);
  CHECK(j["layouts"] == json::array({"nhwc"}));
  CHECK(j["activations"] == json::array({"silu", "none"}));
  CHECK(j["compiled"] == 0);
  // Command-line shapes: silu unless --activation says otherwise; where both layouts are the same memory (no
  // spatial elements) only the channels-first programs are needed.
  j = tune(dir, "warm 1x64x8x8 --dtype bf16 --cache c.sqlite --json").doc();
  CHECK(j["variants"] == 12);
  CHECK(j["activations"] == json::array({"silu"}));
  j = tune(dir, "warm 4x64 --dtype bf16 --activation none,silu --cache c.sqlite --json").doc();
  CHECK(j["variants"] == 12);
  CHECK(j["layouts"] == json::array({"nchw"}));
  CHECK(j["activations"] == json::array({"none", "silu"}));
  // Shapes from a file, with their own dtypes, layouts and activations (NVRTC for fp16:fp32 nhwc none).
  std::ofstream(dir.file("shapes.json")) << R"({"shapes": ["1x256x32x32", {"shape": [2, 64, 16, 16], "groups": 8, "dtypes": ["fp16:fp32"], "layouts": ["nhwc"], "activations": ["none"]}]})";
  r = tune(dir, "warm --shapes-file shapes.json --dtype bf16 --cache c.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  j = r.doc();
  CHECK(j["variants"] == 18);  // bf16 in both layouts (silu), fp16:fp32 nhwc none
  CHECK(j["compiled"] == 6);
  CHECK(has(j["dtypes"], "fp16:fp32"));
  std::ofstream(dir.file("bad.json")) << R"({"shapes": [{"shape": [1, -3]}]})";
  r = tune(dir, "warm --shapes-file bad.json --cache c.sqlite");
  CHECK(r.code == 3);
  CHECK(r.err.find("bad.json item 0") != std::string::npos);
  std::ofstream(dir.file("bad-layout.json")) << R"({"shapes": ["1x64x8x8", {"shape": [1, 64, 8, 8], "layouts": ["nhwx"]}]})";
  r = tune(dir, "warm --shapes-file bad-layout.json --cache c.sqlite");
  CHECK(r.code == 3);
  CHECK(r.err.find("bad-layout.json item 1") != std::string::npos);
  CHECK(r.err.find("\"nhwx\"") != std::string::npos);
  std::ofstream(dir.file("bad-activation.json")) << R"([{"shape": [1, 64, 8, 8], "activations": "none"}])";
  r = tune(dir, "warm --shapes-file bad-activation.json --cache c.sqlite");
  CHECK(r.code == 3);
  CHECK(r.err.find("activations must be") != std::string::npos);
}

TEST_CASE("list, show, export, import, merge: round trips and conflicts, parsed back from --json") {
  TempDir dir("tune-cli");
  {
    Store a(dir.file("a.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(a.put_tuning(entry(key(4, current()), 8, 2.0)));
    REQUIRE(a.put_tuning(entry(key(16, current()), 4, 1.0)));
    KernelImage image;
    image.image = {'c', 'u', 'b', 'i', 'n'};
    image.lowered_names.assign(gnsilu::detail::kKernelCount, "stand-in");  // one name per kernel of a variant
    REQUIRE(a.put_kernel({90, current(), "bf16-bf16-e16-w8-s1"}, image));
    Store c(dir.file("c.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(c.put_tuning(entry(key(4, current()), 16, 0.5)));  // better measured than a's
    REQUIRE(c.put_tuning(entry(key(32, current()), 2, 1.0)));
  }
  Result r = tune(dir, "list --cache missing.sqlite");
  CHECK(r.code == 0);
  CHECK(r.out.find("no cache file yet") != std::string::npos);
  r = tune(dir, "list --cache a.sqlite --json");
  REQUIRE(r.code == 0);
  json j = r.doc();
  REQUIRE(j["entries"].size() == 2);
  CHECK(j["kernels"] == 1);
  CHECK(j["entries"][0]["current"] == true);
  CHECK(j["entries"][0]["speedup"].get<double>() == doctest::Approx(1.2));
  r = tune(dir, "list --cache a.sqlite");
  CHECK(r.out.find("e16 w8 s1 p4") != std::string::npos);
  r = tune(dir, "show 2 --cache a.sqlite --json");
  REQUIRE(r.code == 0);
  CHECK(r.doc()["candidates"].size() == 3);
  CHECK(r.doc()["candidates"][2]["status"] == "wrong output");
  CHECK(tune(dir, "show 3 --cache a.sqlite").code == 2);

  r = tune(dir, "export a.json --cache a.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.doc()["entries"] == 2);
  CHECK(r.doc()["kernels"] == 1);
  // No GPU to check the device against: refused (4) unless forced; nothing written.
  r = tune(dir, "import a.json --cache b.sqlite");
  CHECK(r.code == 4);
  CHECK(r.err.find("--force") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.file("b.sqlite")));
  r = tune(dir, "import a.json --cache b.sqlite --force --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.doc()["added"] == 2);
  CHECK(r.doc()["kernels_added"] == 1);
  r = tune(dir, "import a.json --cache b.sqlite --force --json");
  CHECK(r.doc()["identical"] == 2);
  CHECK(r.doc()["added"] == 0);
  r = tune(dir, "list --cache b.sqlite --json");
  CHECK(r.doc()["entries"].size() == 2);
  // A cache file imports directly too; the conflict on cpg 4 keeps c's better-measured entry.
  r = tune(dir, "import c.sqlite --cache b.sqlite --force --dry-run --json");
  CHECK(r.doc()["replaced"] == 1);
  CHECK(tune(dir, "list --cache b.sqlite --json").doc()["entries"].size() == 2);
  r = tune(dir, "import c.sqlite --cache b.sqlite --force");
  CHECK(r.code == 0);
  CHECK(r.out.find("conflict") != std::string::npos);
  j = tune(dir, "list --cache b.sqlite --json").doc();
  CHECK(j["entries"].size() == 3);
  for (const auto& e : j["entries"]) {
    if (e["key"]["channels_per_group"] == 4) CHECK(e["winner"]["warps"] == 16);
  }

  r = tune(dir, "merge m.json a.sqlite c.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  j = r.doc();
  CHECK(j["entries"] == 3);
  REQUIRE(j["conflicts"].size() == 1);
  CHECK(j["conflicts"][0]["kept"]["warps"] == 16);
  CHECK(j["conflicts"][0]["incoming_kept"] == true);
  r = tune(dir, "merge m.sqlite m.json a.json --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(tune(dir, "list --cache m.sqlite --json").doc()["entries"].size() == 3);
}

TEST_CASE("corrupt inputs exit 3 and change nothing") {
  TempDir dir("tune-cli");
  {
    Store a(dir.file("a.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(a.put_tuning(entry(key(4, current()), 8, 2.0)));
  }
  REQUIRE(tune(dir, "export a.json --cache a.sqlite").code == 0);
  const std::string good = read_bytes(dir.file("a.json"));
  std::ofstream(dir.file("half.json")) << good.substr(0, good.size() / 2);
  std::ofstream(dir.file("garbage.json")) << "\x01\x02 not json";
  std::ofstream(dir.file("fake.sqlite"), std::ios::binary) << std::string("SQLite format 3\0", 16) << std::string(3000, '\xAB');
  const auto before = read_bytes(dir.file("a.sqlite"));
  for (const char* input : {"half.json", "garbage.json", "fake.sqlite", "missing.json"}) {
    Result r = tune(dir, std::string("import ") + input + " --cache a.sqlite --force");
    CHECK_MESSAGE(r.code == 3, input << ": " << r.err);
    CHECK_MESSAGE(r.err.find(input) != std::string::npos, r.err);
    r = tune(dir, std::string("merge out.json a.json ") + input);
    CHECK_MESSAGE(r.code == 3, input << ": " << r.err);
  }
  CHECK_FALSE(fs::exists(dir.file("out.json")));
  CHECK(read_bytes(dir.file("a.sqlite")) == before);
  CHECK(tune(dir, "list --cache fake.sqlite").code == 3);
  CHECK(tune(dir, "export x.json --cache fake.sqlite").code == 3);
  CHECK(fs::file_size(dir.file("fake.sqlite")) == 3016);
}

TEST_CASE("prune drops other kernel versions; report draws every candidate") {
  TempDir dir("tune-cli");
  {
    Store a(dir.file("a.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(a.put_tuning(entry(key(4, current()), 8, 2.0)));
    REQUIRE(a.put_tuning(entry(key(8, "old-version"), 8, 2.0)));
    KernelImage image;
    image.image = {'x'};
    image.lowered_names.assign(gnsilu::detail::kKernelCount, "stand-in");  // one name per kernel of a variant
    REQUIRE(a.put_kernel({90, "old-version", "bf16-bf16-e16-w8-s1"}, image));
    REQUIRE(a.put_kernel({90, current(), "bf16-bf16-e16-w8-s1"}, image));
  }
  Result r = tune(dir, "list --cache a.sqlite");
  CHECK(r.out.find("stale") != std::string::npos);
  r = tune(dir, "prune --cache a.sqlite --dry-run --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.doc()["entries_removed"] == 1);
  CHECK(r.doc()["kernels_removed"] == 1);
  CHECK(tune(dir, "list --cache a.sqlite --json").doc()["entries"].size() == 2);
  r = tune(dir, "prune --cache a.sqlite --json");
  CHECK(r.doc()["entries_removed"] == 1);
  {
    const json j = tune(dir, "list --cache a.sqlite --json").doc();
    CHECK(j["entries"].size() == 1);
    CHECK(j["kernels"] == 1);
  }
  r = tune(dir, "report r.html --cache a.sqlite");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const std::string html = read_bytes(dir.file("r.html"));
  CHECK(html.find("<!DOCTYPE html>") == 0);
  CHECK(html.find("<svg") != std::string::npos);
  CHECK(html.find("wrong output") != std::string::npos);
  CHECK(html.find("e16 w4 s2 p8 (default)") != std::string::npos);  // the split path's default, a sample candidate
  r = tune(dir, "report r.svg --cache a.sqlite --json");
  CHECK(r.doc()["format"] == "svg");
  CHECK(read_bytes(dir.file("r.svg")).find("<svg xmlns") != std::string::npos);
  CHECK(tune(dir, "verify --cache a.sqlite").code == 5);  // re-timing needs a GPU
}

TEST_CASE("layouts and activations: list, show, report, export, import and merge keep them apart") {
  using gnsilu::Activation;
  using gnsilu::Layout;
  TempDir dir("tune-cli");
  const TuningKey nchw_silu = key(4, current());
  const TuningKey nhwc_none = with_form(key(4, current()), Layout::ChannelsLast, Activation::None);
  const TuningKey nhwc_silu = with_form(key(16, current()), Layout::ChannelsLast, Activation::SiLU);
  {
    Store a(dir.file("a.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(a.put_tuning(entry(nchw_silu, 8, 2.0)));
    REQUIRE(a.put_tuning(entry(nhwc_none, 16, 1.0)));  // the same key but for its layout and activation
    REQUIRE(a.put_tuning(entry(nhwc_silu, 4, 1.0)));
  }
  Result r = tune(dir, "list --cache a.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  json j = r.doc();
  REQUIRE(j["entries"].size() == 3);
  CHECK(j["entries"][0]["key"]["layout"] == "nchw");
  CHECK(j["entries"][0]["key"]["activation"] == "silu");
  CHECK(j["entries"][1]["key"]["layout"] == "nhwc");
  CHECK(j["entries"][1]["key"]["activation"] == "none");
  CHECK(j["entries"][1]["winner"]["warps"] == 16);
  r = tune(dir, "list --cache a.sqlite");
  REQUIRE(r.code == 0);
  {
    const std::string header = r.out.substr(0, r.out.find('\n'));
    CHECK(header.find("layout") != std::string::npos);
    CHECK(header.find("activation") != std::string::npos);
    // Row 2 names nhwc and none in the columns under those headers.
    const auto row2 = r.out.find("\n2 ");
    REQUIRE(row2 != std::string::npos);
    const std::string line = r.out.substr(row2 + 1, r.out.find('\n', row2 + 1) - row2 - 1);
    CHECK(line.find("nhwc") == header.find("layout"));
    CHECK(line.find("none") == header.find("activation"));
  }
  r = tune(dir, "show 2 --cache a.sqlite");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("layout:     nhwc (channels-last)") != std::string::npos);
  CHECK(r.out.find("activation: none (plain GroupNorm)") != std::string::npos);
  CHECK(r.out.find("bf16>bf16 nhwc none") != std::string::npos);
  r = tune(dir, "show 1 --cache a.sqlite --json");
  CHECK(r.doc()["key"]["layout"] == "nchw");
  CHECK(r.doc()["key"]["activation"] == "silu");
  r = tune(dir, "report r.html --cache a.sqlite");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  {
    const std::string html = read_bytes(dir.file("r.html"));
    CHECK(html.find("<th>layout</th><th>activation</th>") != std::string::npos);
    CHECK(html.find("<td>nhwc</td><td>none</td>") != std::string::npos);
    CHECK(html.find("<td>nchw</td><td>silu</td>") != std::string::npos);
  }

  // Export and back: the three stay three.
  r = tune(dir, "export a.json --cache a.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const std::string text = read_bytes(dir.file("a.json"));
  CHECK(text.find("\"layout\": \"nhwc\"") != std::string::npos);
  CHECK(text.find("\"activation\": \"none\"") != std::string::npos);
  r = tune(dir, "import a.json --cache b.sqlite --force --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.doc()["added"] == 3);
  CHECK(r.doc()["conflicts"].empty());
  {
    Store b(dir.file("b.sqlite"), Store::Mode::ReadOnly);
    CHECK(b.find_tuning(nhwc_none)->winner.warps == 16);
    CHECK(b.find_tuning(nchw_silu)->winner.warps == 8);
    CHECK(b.find_tuning(nhwc_silu)->winner.warps == 4);
  }
  // A conflict is only between entries of one layout and activation.
  {
    Store c(dir.file("c.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(c.put_tuning(entry(nhwc_none, 2, 0.5)));  // better measured than a's
  }
  r = tune(dir, "merge m.json a.sqlite c.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  j = r.doc();
  CHECK(j["entries"] == 3);
  REQUIRE(j["conflicts"].size() == 1);
  CHECK(j["conflicts"][0]["key"]["layout"] == "nhwc");
  CHECK(j["conflicts"][0]["key"]["activation"] == "none");
  CHECK(j["conflicts"][0]["kept"]["warps"] == 2);
  r = tune(dir, "import c.sqlite --cache b.sqlite --force");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("conflict NVIDIA H200 sm90 | cpg4 bf16>bf16 nhwc none | dram-split") != std::string::npos);

  // An export from before keys had layouts (format version 1) imports as nchw / silu.
  json old = json::parse(text);
  old["format_version"] = 1;
  json kept = json::array();
  for (auto& e : old["tuning"]) {
    if (e["key"]["layout"] != "nchw" || e["key"]["activation"] != "silu") continue;
    e["key"].erase("layout");
    e["key"].erase("activation");
    kept.push_back(e);
  }
  old["tuning"] = kept;
  std::ofstream(dir.file("old.json")) << old.dump(1);
  r = tune(dir, "import old.json --cache d.sqlite --force --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.doc()["added"] == 1);
  j = tune(dir, "list --cache d.sqlite --json").doc();
  REQUIRE(j["entries"].size() == 1);
  CHECK(j["entries"][0]["key"]["layout"] == "nchw");
  CHECK(j["entries"][0]["key"]["activation"] == "silu");
  // An unknown layout in an export: exit 3, naming the file and the field.
  std::string bad = text;
  bad.replace(bad.find("\"layout\": \"nhwc\""), 16, "\"layout\": \"nhcw\"");
  std::ofstream(dir.file("bad.json")) << bad;
  r = tune(dir, "import bad.json --cache d.sqlite --force");
  CHECK(r.code == 3);
  CHECK(r.err.find("bad.json: tuning[") != std::string::npos);
  CHECK(r.err.find("].key.layout: \"nhcw\"") != std::string::npos);
}

TEST_CASE("a cache file of schema 2 is listed, shown, exported and imported without being changed") {
  TempDir dir("tune-cli");
  const std::string path = dir.file("v2.sqlite");
  REQUIRE(Store::create_at_version(path, 2));
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    db.exec("INSERT INTO tuning (device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, code_version, "
            "channels_per_group, x_dtype, y_dtype, size_class, elems_per_load, warps, stages, programs_per_sm, "
            "default_us, best_us, noise_us, tuned_shape, library_version, created_at) VALUES ('NVIDIA H200', 90, 132, "
            "143771, 61440, '" + current() + "', 4, 'bf16', 'bf16', 'dram-split', 16, 8, 1, 4, 300, 250, 1, "
            "'1x512x16384 G=32', '0.1.0', 1700000000)");
    db.exec("INSERT INTO timings (tuning_id, elems_per_load, warps, stages, programs_per_sm, median_us, noise_us, "
            "samples, status) VALUES (1, 16, 8, 1, 4, 250, 1, 9, 'ok')");
    db.exec("PRAGMA journal_mode = DELETE");
  }
  const std::string before = read_bytes(path);
  Result r = tune(dir, "list --cache v2.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  json j = r.doc();
  REQUIRE(j["entries"].size() == 1);
  CHECK(j["entries"][0]["key"]["layout"] == "nchw");
  CHECK(j["entries"][0]["key"]["activation"] == "silu");
  CHECK(j["entries"][0]["winner"]["warps"] == 8);
  CHECK(j["entries"][0]["current"] == true);
  CHECK(j["entries"][0]["tuned_shape"] == "1x512x16384 G=32");  // read once from the text into typed fields
  CHECK(j["entries"][0]["tuned_dims"] == json::array({1, 512, 16384}));
  CHECK(j["entries"][0]["tuned_groups"] == 32);
  CHECK(j["entries"][0]["path"] == "split");
  r = tune(dir, "show 1 --cache v2.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.doc()["candidates"].size() == 1);
  r = tune(dir, "export v2.json --cache v2.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.doc()["entries"] == 1);
  r = tune(dir, "import v2.sqlite --cache new.sqlite --force --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.doc()["added"] == 1);
  CHECK(tune(dir, "prune --cache v2.sqlite --dry-run --json").doc()["entries_removed"] == 0);
  CHECK(read_bytes(path) == before);  // read, never upgraded in place by a reading command
  {
    Store fresh(dir.file("new.sqlite"), Store::Mode::ReadOnly);
    const auto e = fresh.find_tuning(key(4, current()));
    REQUIRE(e.has_value());
    CHECK(e->winner.warps == 8);
  }
  // A command that writes the file upgrades it, as the library does.
  r = tune(dir, "prune --cache v2.sqlite --json");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  CHECK(db.execAndGet("PRAGMA user_version").getInt() == kSchemaVersion);
}

TEST_CASE("--arch takes the spellings users type, and names one it does not understand") {
  using gnsilu::tune::parse_arch;
  for (const char* spelling : {"90", "sm_90", "sm90", "SM_90", "compute_90", "9.0"}) {
    CAPTURE(spelling);
    CHECK(parse_arch(spelling) == 90);
  }
  CHECK(parse_arch("10.0") == 100);
  CHECK(parse_arch("sm_121") == 121);
  CHECK(parse_arch("12.1") == 121);
  CHECK(parse_arch("compute_75") == 75);
  for (const char* bad : {"", "sm_", "sm_90a", "9", "9.00", "x90", "90.5.1", "-90", "sm_1000"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_arch(bad));
  }
  std::string rejected;
  CHECK(gnsilu::tune::parse_archs({"sm_90", "90", "10.0"}, rejected) == std::vector<int>{90, 100});
  CHECK(rejected.empty());
  CHECK(gnsilu::tune::parse_archs({"sm_90", "hopper"}, rejected).empty());
  CHECK(rejected == "hopper");

  TempDir dir("tune-cli");
  const Result r = tune(dir, "compile --arch sm_90,hopper --cache c.sqlite");
  CHECK(r.code == 2);
  CHECK(r.err.find("--arch hopper") != std::string::npos);
  CHECK(r.err.find("sm_90") != std::string::npos);  // the spellings it takes
  const Result old = tune(dir, "compile --arch compute_70 --cache c.sqlite");
  CHECK(old.code == 2);
  CHECK(old.err.find("7.5") != std::string::npos);
  CHECK(tune(dir, "warm 1x64x8x8 --no-wait --wait 5 --compile-only --arch 9.0 --dtype bf16 --layout nchw --help").code == 0);
  CHECK(tune(dir, "warm 1x64x8x8 --wait -1 --cache c.sqlite").code == 2);
}

TEST_CASE("SIGINT and SIGTERM end gnsilu-tune with 130 and 143, the cache file consistent") {
  TempDir dir("tune-cli");
  for (int signal : {SIGINT, SIGTERM}) {
    CAPTURE(signal);
    const std::string cache = dir.file("interrupted-" + std::to_string(signal) + ".sqlite");
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // a long compile (NVRTC for every variant of sm_90), interrupted while it writes kernels
      setenv("GNSILU_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
      const std::string err = dir.file("stderr-" + std::to_string(signal));
      if (!freopen(err.c_str(), "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(99);
      execl(GNSILU_TUNE_BINARY, "gnsilu-tune", "compile", "--arch", "sm_90", "--cache", cache.c_str(),
            static_cast<char*>(nullptr));
      _exit(98);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    kill(child, signal);
    int status = 0;
    waitpid(child, &status, 0);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 128 + signal);
    const std::string err = read_bytes(dir.file("stderr-" + std::to_string(signal)));
    CHECK(err.find(signal == SIGINT ? "interrupted (SIGINT)" : "interrupted (SIGTERM)") != std::string::npos);
    CHECK(err.find("released 0 tuning leases") != std::string::npos);
    SQLite::Database db(cache, SQLite::OPEN_READONLY);
    SQLite::Statement q(db, "PRAGMA integrity_check");
    REQUIRE(q.executeStep());
    CHECK(q.getColumn(0).getString() == "ok");
    Store s(cache, Store::Mode::ReadOnly);
    CHECK(s.usable());
    MESSAGE("interrupted after 2.5 s with " << s.kernel_count() << " kernels in the file");
  }
}

TEST_CASE("verify --kernels rebuilds every cached kernel; a kernel replaced with a matching checksum is caught, and "
          "import --verify-kernels refuses it") {
  TempDir dir("tune-cli");
  const gnsilu::detail::Variant variant{gnsilu::DType::BF16, gnsilu::DType::BF16, gnsilu::LaunchConfig{16, 4, 1, 4},
                                        gnsilu::Layout::ChannelsFirst, gnsilu::Activation::SiLU};
  REQUIRE(gnsilu::detail::variant_of_code_name(gnsilu::detail::code_name(variant)) == variant);
  CHECK_FALSE(gnsilu::detail::variant_of_code_name("bf16-bf16-e16-w4-s1-nchw"));
  CHECK_FALSE(gnsilu::detail::variant_of_code_name("bf16-bf16-e12-w4-s1-nchw-silu"));
  const auto first = gnsilu::detail::compile_variants(90, std::span(&variant, 1));
  const auto second = gnsilu::detail::compile_variants(90, std::span(&variant, 1));
  CHECK(first.image == second.image);  // NVRTC: the same bytes for the same source, options and version
  const KernelKey key{90, current(), gnsilu::detail::code_name(variant)};
  auto image_of = [](const gnsilu::detail::CompiledProgram& p) {
    return KernelImage{p.is_cubin, p.image, p.lowered_names, p.options, ""};
  };
  {
    Store s(dir.file("c.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(s.put_kernel(key, image_of(first)));
  }
  CHECK(tune(dir, "export good.json --cache c.sqlite").code == 0);
  {
    Store s(dir.file("c.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(s.put_kernel({90, "another-version", key.variant}, image_of(first)));
  }
  Result ok = tune(dir, "verify --kernels --cache c.sqlite --json");
  CHECK(ok.code == 0);
  CHECK(ok.doc()["same"] == 1);
  CHECK(ok.doc()["other_kernel_version"] == 1);
  CHECK(tune(dir, "export mixed.json --cache c.sqlite").code == 0);
  Result unverifiable = tune(dir, "import mixed.json --force --verify-kernels --cache mixed.sqlite");
  CHECK(unverifiable.code == 4);  // a kernel that cannot be rebuilt here is not taken on trust
  CHECK(unverifiable.err.find("could not be rebuilt here") != std::string::npos);

  // An attacker's kernel: one byte changed, the checksum written to match (put_kernel computes it).
  KernelImage evil = image_of(first);
  evil.image[evil.image.size() / 2] ^= 0x5a;
  {
    Store s(dir.file("c.sqlite"), Store::Mode::ReadWrite);
    REQUIRE(s.put_kernel(key, evil));
    REQUIRE(s.find_kernel(key));  // the checksum does not see it
  }
  Result caught = tune(dir, "verify --kernels --cache c.sqlite");
  CHECK(caught.code == 7);
  CHECK(caught.out.find("differs  sm_90 " + key.variant) != std::string::npos);
  CHECK(tune(dir, "export evil.json --cache c.sqlite").code == 0);
  Result refused = tune(dir, "import evil.json --force --verify-kernels --cache into.sqlite");
  CHECK(refused.code == 7);
  CHECK(refused.err.find("differ from their rebuild") != std::string::npos);
  CHECK(!fs::exists(dir.file("into.sqlite")));  // nothing imported
  Result good = tune(dir, "import good.json --force --verify-kernels --cache into.sqlite --json");
  CHECK(good.code == 0);
  CHECK(good.doc()["kernels_added"] == 1);
  Result plain = tune(dir, "import evil.json --force --no-kernels --cache tuning-only.sqlite");
  CHECK(plain.code == 0);
  CHECK(Store(dir.file("tuning-only.sqlite"), Store::Mode::ReadOnly).kernel_count() == 0);
}
