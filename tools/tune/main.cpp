// gnsilu-tune: pre-warms gnsilu's cache before traffic arrives and carries it between identical machines.
//
//   gnsilu-tune warm --preset flux              tune every key the Flux VAE needs (compile only without a GPU)
//   gnsilu-tune compile --arch 90,100           compile every kernel variant, no GPU needed
//   gnsilu-tune list | show N                   what the cache holds
//   gnsilu-tune export fleet.json               a portable file; `import fleet.json` on an identical machine
//   gnsilu-tune merge out.json a.json b.sqlite  combine caches, keeping the better-measured entries
//   gnsilu-tune verify | prune | report r.html  re-time winners, drop stale entries, draw every candidate
#include <CLI/CLI.hpp>
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "commands.hpp"
#include "gnsilu/gnsilu.hpp"
#include "cache/cache.hpp"
#include "cache/lease.hpp"
#include "cache/transfer/transfer.hpp"

namespace {

using namespace gnsilu::tune;

// SIGINT and SIGTERM are taken by one thread (blocked in all others, which inherit the mask: call this first). It
// releases the tuning leases this process holds in the user cache file, so that other processes need not wait
// for them, and exits with 128 + the signal. A write in progress on another thread is a SQLite transaction that
// is either committed or rolled back when the file is next opened: the file stays consistent.
void handle_interrupts() {
  static sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([] {
    int signal = 0;
    if (sigwait(&set, &signal) != 0) return;
    int released = 0;
    if (gnsilu::cache::Store* user = gnsilu::cache::process_cache()->user(); user != nullptr && user->writable())
      released = user->release_process_leases(gnsilu::cache::LeaseHolder::self());
    std::fprintf(stderr, "gnsilu-tune: interrupted (%s); released %d tuning lease%s\n",
                 signal == SIGINT ? "SIGINT" : "SIGTERM", released, released == 1 ? "" : "s");
    std::fflush(stdout);
    std::_Exit(128 + signal);
  }).detach();
}

void add_common(CLI::App* sub, Common& c, bool json = true) {
  sub->add_option("--cache", c.cache, "Cache file (default: GNSILU_CACHE, else ~/.cache/gnsilu/cache.sqlite)");
  if (json) sub->add_flag("--json", c.json, "Print one JSON document on stdout instead of text");
}

}  // namespace

// The command line read and run; main() turns anything this throws while setting the line up into exit 1.
int run_command_line(int argc, char** argv) {
  handle_interrupts();
  CLI::App app("gnsilu-tune " + std::string(gnsilu::version()) +
               ": pre-warm gnsilu's tuning and kernel cache, and carry it between identical machines.");
  app.footer(kExitCodesHelp);
  app.require_subcommand(1);
  app.set_version_flag("--version", gnsilu::version());

  WarmOptions warm;
  auto* w = app.add_subcommand("warm", "Tune every key the given shapes need (compile only without a GPU)");
  w->footer(std::string("Presets: flux, sd3, sdxl (image VAEs, 1024x1024 by default), hunyuan-video (720x1280, 33 "
                        "frames by default): the GroupNorm+SiLU inputs of their encoder and decoder, and the plain "
                        "GroupNorm (activation none) of their mid blocks' attention, 32 groups; --activation, when "
                        "given, keeps only the preset shapes of those activations.\n"
                        "Layouts: nchw (channels_first, channels-first, ncdhw) and nhwc (channels_last, "
                        "channels-last, ndhwc), each tuned separately.\n") +
            kExitCodesHelp);
  w->add_option("shapes", warm.shapes, "Activation shapes N x C x spatial..., like 1x512x128x128");
  w->add_option("--preset", warm.presets, "Built-in VAE: flux, sd3, sdxl, hunyuan-video (repeatable)");
  w->add_option("--shapes-file", warm.shape_files, "JSON file of shapes (see the README)")->check(CLI::ExistingFile);
  w->add_option("--dtype", warm.dtypes, "dtypes: bf16, fp16, fp32, or X:Y for x and y (default bf16,fp16)")
      ->delimiter(',');
  w->add_option("--layout", warm.layouts, "Memory layouts: nchw, nhwc (default nchw,nhwc: both)")->delimiter(',');
  w->add_option("--activation", warm.activations,
                "Activations: silu, none (plain GroupNorm); default silu (presets: what the model applies)")
      ->delimiter(',');
  w->add_option("--groups", warm.groups, "Groups of the command-line shapes")->capture_default_str();
  w->add_option("--resolution", warm.resolution, "Preset image size: 1024 or HEIGHTxWIDTH");
  w->add_option("--frames", warm.preset.frames, "Preset video frames (4k + 1)");
  w->add_option("--batch", warm.preset.batch, "Preset batch size")->capture_default_str();
  w->add_option("--part", warm.preset.part, "Preset part: decoder, encoder or both")->capture_default_str();
  w->add_flag("--retune", warm.retune, "Time the candidates again even for keys already cached");
  w->add_flag("--compile-only", warm.compile_only, "Only compile kernels (as without a GPU)");
  w->add_option("--arch", warm.archs, "Architectures to compile for without a GPU: 90, sm_90, sm90, compute_90 or 9.0 "
                                      "(default 90)")->delimiter(',');
  w->add_option("--wait", warm.wait, "Seconds to wait for another process tuning the same key")
      ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
  w->add_flag_callback("--no-wait", [&warm] { warm.wait = 0; }, "Do not wait for other processes (same as --wait 0)");
  w->add_option("--device", warm.device, "CUDA device ordinal")->capture_default_str();
  w->add_flag("--quiet", warm.common.quiet, "No progress lines");
  add_common(w, warm.common);

  CompileOptions compile;
  auto* c = app.add_subcommand("compile", "Compile every kernel variant into the cache (no GPU needed)");
  c->footer(kExitCodesHelp);
  c->add_option("--arch", compile.archs,
                "Architectures: 90, sm_90, sm90, compute_90 or 9.0, comma lists too (default: this machine's GPU)")
      ->delimiter(',');
  c->add_option("--dtype", compile.dtypes, "dtype pairs like bf16 or bf16:fp32 (default: all nine)")->delimiter(',');
  c->add_option("--layout", compile.layouts, "Memory layouts: nchw, nhwc (default nchw,nhwc: both)")->delimiter(',');
  c->add_option("--activation", compile.activations, "Activations: silu, none (default silu,none: both)")
      ->delimiter(',');
  c->add_option("--device", compile.device, "CUDA device ordinal (without --arch)")->capture_default_str();
  c->add_flag("--quiet", compile.common.quiet, "No progress lines");
  add_common(c, compile.common);

  Common list;
  auto* l = app.add_subcommand("list", "The tuned entries of a cache: keys, winners, speedup, age");
  l->footer(kExitCodesHelp);
  add_common(l, list);

  ShowOptions show;
  auto* s = app.add_subcommand("show", "One entry with every candidate's timing");
  s->footer(kExitCodesHelp);
  s->add_option("id", show.id, "Row number from list")->required();
  add_common(s, show.common);

  TransferOptions exp;
  auto* e = app.add_subcommand("export", "Write the cache as a portable file for identical machines");
  e->footer(kExitCodesHelp);
  e->add_option("file", exp.file, "Output file (JSON)")->required();
  e->add_flag("--no-kernels", exp.no_kernels, "Leave the compiled kernels out");
  add_common(e, exp.common);

  TransferOptions imp;
  auto* i = app.add_subcommand("import", "Add an exported file (or another cache file) to the cache");
  i->footer(std::string("Entries must be for this GPU (name, architecture, SMs, memory, L2) and this kernel version; "
                        "otherwise nothing is imported (exit 4) unless --skip-mismatched or --force. Conflicts keep "
                        "the better-measured entry.\n") +
            kExitCodesHelp);
  i->add_option("file", imp.file, "Export file or SQLite cache file")->required();
  i->add_flag("--force", imp.force, "Import mismatching entries too (and import without a GPU to check against)");
  i->add_flag("--skip-mismatched", imp.skip_mismatched, "Import the entries that fit, skip the others");
  i->add_flag("--dry-run", imp.dry_run, "Report what would change, change nothing");
  i->add_flag("--no-kernels", imp.no_kernels, "Leave the compiled kernels out (import the tuned entries alone)");
  i->add_flag("--verify-kernels", imp.verify_kernels,
              "Rebuild every kernel with NVRTC first; import nothing if one differs (exit 7)");
  i->add_option("--device", imp.device, "CUDA device ordinal to check against")->capture_default_str();
  add_common(i, imp.common);

  TransferOptions merge;
  auto* m = app.add_subcommand("merge", "Merge cache and export files into one (no device check)");
  m->footer(std::string("OUTPUT ending in .json is written anew as an export file; otherwise it is a cache file "
                        "merged into (created if missing). Conflicts keep the better-measured entry: more "
                        "candidates timed, then lower relative noise, then newer.\n") +
            kExitCodesHelp);
  m->add_option("output", merge.file, "Output: file.json (export) or a cache file")->required();
  m->add_option("inputs", merge.inputs, "Export or cache files")->required();
  m->add_flag("--no-kernels", merge.no_kernels, "Leave the compiled kernels out");
  m->add_flag("--json", merge.common.json, "Print one JSON document on stdout instead of text");

  VerifyOptions verify;
  auto* v = app.add_subcommand("verify", "Re-time the cached winners on this GPU and report drift");
  v->footer(kExitCodesHelp);
  v->add_option("--tolerance", verify.tolerance, "Drift reported beyond this fraction")->capture_default_str();
  v->add_option("--samples", verify.samples, "Timed runs of the winner and of the default")->capture_default_str();
  v->add_flag("--strict", verify.strict, "Exit 6 when an entry drifted beyond the tolerance");
  v->add_flag("--kernels", verify.kernels,
              "Instead: rebuild every cached kernel with NVRTC and compare its bytes (exit 7 when one differs; no "
              "GPU needed)");
  v->add_option("--device", verify.device, "CUDA device ordinal")->capture_default_str();
  v->add_flag("--quiet", verify.common.quiet, "No progress lines");
  add_common(v, verify.common);

  TransferOptions prune;
  auto* p = app.add_subcommand("prune", "Drop entries and kernels no current kernel version can use");
  p->footer(kExitCodesHelp);
  p->add_flag("--dry-run", prune.dry_run, "Report what would be removed, remove nothing");
  add_common(p, prune.common);

  ReportOptions report;
  auto* r = app.add_subcommand("report", "An HTML page or SVG image charting every candidate's time per key");
  r->footer(kExitCodesHelp);
  r->add_option("output", report.output, "Output file (.html or .svg)")->required();
  r->add_option("--format", report.format, "html or svg (default: from the file name)");
  add_common(r, report.common);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& err) {  // --help, --help-all, --version
    return app.exit(err);
  } catch (const CLI::ParseError& err) {
    std::fprintf(stderr, "gnsilu-tune: %s (see gnsilu-tune --help)\n", err.what());
    return kUsage;
  }
  // GNSILU_TUNE_PARSE_ONLY=1: the command line is parsed and nothing runs (tools/check_docs.py checks the README's
  // commands with it on machines where running them would take a GPU or many minutes of NVRTC).
  if (const char* only = std::getenv("GNSILU_TUNE_PARSE_ONLY"); only != nullptr && std::string(only) == "1") {
    for (const auto* sub : app.get_subcommands())
      std::printf("gnsilu-tune: '%s' parsed, not run\n", sub->get_name().c_str());
    return 0;
  }

  try {
    if (*w) return run_warm(warm);
    if (*c) return run_compile(compile);
    if (*l) return run_list(list);
    if (*s) return run_show(show);
    if (*e) return run_export(exp);
    if (*i) return run_import(imp);
    if (*m) return run_merge(merge);
    if (*v) return run_verify(verify);
    if (*p) return run_prune(prune);
    if (*r) return run_report(report);
  } catch (const CliError& err) {
    std::fprintf(stderr, "gnsilu-tune: %s\n", err.what());
    return err.code();
  } catch (const gnsilu::Error& err) {
    std::fprintf(stderr, "gnsilu-tune: %s\n", err.what());
    return kFailed;
  } catch (const std::exception& err) {
    std::fprintf(stderr, "gnsilu-tune: %s\n", err.what());
    return kFailed;
  }
  return kUsage;
}

int main(int argc, char** argv) {
  try {
    return run_command_line(argc, argv);
  } catch (const std::exception& err) {  // building the command line itself failed (out of memory, ...)
    std::fprintf(stderr, "gnsilu-tune: %s\n", err.what());
    return kFailed;
  }
}
