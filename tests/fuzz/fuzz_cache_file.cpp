// libFuzzer target: a cache file of any content opened by gnsilu::cache::Store, read-only and read-write, and used.
// The file starts from the input's own bytes or from one of a few real files made at start-up (a gnsilu cache with
// entries, kernels and a lease; the same in rollback-journal mode; schema 1; another program's SQLite file; an
// export of the first, as gnsilu-tune writes it; a schema-2 cache with entries, kernels and a lease, from before
// keys had a layout and an activation), and the input then patches bytes, header fields, truncates or appends;
// then a sequence of calls runs: the store's, and the import path's (read_bundle, which reads a cache of an older
// schema through Store::read_upgraded, and merge_into).
//
// Invariants (cache/store.hpp): nothing throws or crashes; a file the store cannot use (and every file opened
// read-only) is never changed, truncated or deleted; an unusable store answers "not found"; what it returns is
// well-formed; on an unmodified cache template, written entries and kernels read back as written, and leases
// behave (one owner at a time).
// Input format: corpus/README.md. To fuzz another entry point (e.g. an import of a cache file), add one line to
// kOperations.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <SQLiteCpp/SQLiteCpp.h>

#include "cache/entries.hpp"
#include "input.hpp"
#include "cache/store.hpp"
#include "cache/transfer/transfer.hpp"

namespace {

namespace fs = std::filesystem;
using gnsilu::Activation;
using gnsilu::DType;
using gnsilu::LaunchConfig;
using gnsilu::Layout;
using gnsilu::cache::KernelImage;
using gnsilu::cache::KernelKey;
using gnsilu::cache::Store;
using gnsilu::cache::TuningEntry;
using gnsilu::cache::TuningKey;
using gnsilu::fuzz::Input;
using Bytes = std::vector<uint8_t>;

#define REQUIRE(cond, detail)                                                               \
  do {                                                                                      \
    if (!(cond)) gnsilu::fuzz::broken("fuzz_cache_file", #cond, __FILE__, __LINE__, detail); \
  } while (0)

std::string g_dir;   // a private temporary folder
std::string g_path;  // the cache file in it
std::vector<Bytes> g_templates;
std::vector<TuningKey> g_keys;     // keys of the template's entries (and a few others)
std::vector<KernelKey> g_kernels;  // keys of the template's kernels (and a few others)
gnsilu::cache::Bundle g_bundle;    // what the populated template holds

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "fuzz_cache_file: cannot write %s\n", path.c_str());
    std::abort();
  }
}

void remove_files() {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((g_path + suffix).c_str());
}

TuningKey make_key(int i) {
  TuningKey k;
  k.device = {"NVIDIA H200", 90, 132, 143771, 61440};
  k.code_version = "code-" + std::to_string(i / 3);
  k.channels_per_group = 16 << (i % 4);
  k.x_dtype = static_cast<DType>(1 + i % 3);
  k.y_dtype = static_cast<DType>(1 + (i / 2) % 3);
  k.size_class = i % 2 ? "l2-fused" : "dram-split";
  k.layout = i % 4 == 3 ? Layout::ChannelsLast : Layout::ChannelsFirst;
  k.activation = i % 5 == 4 ? Activation::None : Activation::SiLU;
  return k;
}

TuningEntry make_entry(const TuningKey& key, int i) {
  TuningEntry e;
  e.key = key;
  e.winner = {8 << (i % 3), 4 << (i % 3), 1 + i % 2, 2 << (i % 3)};
  e.default_us = 100 + i;
  e.best_us = 90 + i;
  e.noise_us = 0.5;
  e.tuned_shape = {{1, 512, 128, 128}, 32, key.size_class == "l2-fused" ? gnsilu::Path::Fused : gnsilu::Path::Split};
  e.library_version = "0.1.0";
  e.created_at = 1764000000 + i;
  for (int c = 0; c < 1 + i % 3; ++c) {
    e.candidates.push_back({{8 << c, 4, 1, 8}, 90.0 + c, 0.5, 7, c == 2 ? "compile failed: x" : "ok"});
  }
  return e;
}

KernelKey make_kernel_key(int i) { return {75 + 5 * (i % 4), "code-" + std::to_string(i / 4), "bf16-bf16-e16-w8-s1"}; }

KernelImage make_image(int i) {
  KernelImage k;
  k.is_cubin = i % 2 == 0;
  k.image.assign(64 + 200 * i, static_cast<char>('A' + i));
  k.lowered_names = {"_Z6fused" + std::to_string(i), "_Z5stats", "_Z5apply"};
  k.options = "--gpu-architecture=sm_90";
  k.nvrtc_version = "13.0";
  return k;
}

// A schema-2 cache (before layouts and activations: key columns up to size_class) with the entries of the keys
// `keys` (channels-first GroupNorm+SiLU ones, what schema 2 held), their timings, kernels 0 to 3 and the lease of
// the current template, written with SQL as the gnsilu of that schema wrote them.
void make_schema_2(const std::vector<std::size_t>& keys) {
  Store::create_at_version(g_path, 2);
  SQLite::Database db(g_path, SQLite::OPEN_READWRITE);
  SQLite::Transaction t(db);
  for (std::size_t i : keys) {
    const TuningEntry e = make_entry(g_keys[i], static_cast<int>(i));
    SQLite::Statement ins(db, "INSERT INTO tuning (device_name, device_arch, device_sms, device_memory_mib, device_l2_kib, "
                              "code_version, channels_per_group, x_dtype, y_dtype, size_class, elems_per_load, warps, "
                              "stages, programs_per_sm, default_us, best_us, noise_us, tuned_shape, library_version, "
                              "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    ins.bind(1, e.key.device.name);
    ins.bind(2, e.key.device.arch);
    ins.bind(3, e.key.device.sms);
    ins.bind(4, static_cast<int64_t>(e.key.device.memory_mib));
    ins.bind(5, e.key.device.l2_kib);
    ins.bind(6, e.key.code_version);
    ins.bind(7, static_cast<int64_t>(e.key.channels_per_group));
    ins.bind(8, std::string(gnsilu::dtype_name(e.key.x_dtype)));
    ins.bind(9, std::string(gnsilu::dtype_name(e.key.y_dtype)));
    ins.bind(10, e.key.size_class);
    ins.bind(11, e.winner.elems_per_load);
    ins.bind(12, e.winner.warps);
    ins.bind(13, e.winner.stages);
    ins.bind(14, e.winner.programs_per_sm);
    ins.bind(15, e.default_us);
    ins.bind(16, e.best_us);
    ins.bind(17, e.noise_us);
    ins.bind(18, e.tuned_shape.text());
    ins.bind(19, e.library_version);
    ins.bind(20, static_cast<int64_t>(e.created_at));
    ins.exec();
    const int64_t id = db.getLastInsertRowid();
    for (const auto& c : e.candidates) {
      SQLite::Statement tim(db, "INSERT INTO timings (tuning_id, elems_per_load, warps, stages, programs_per_sm, "
                                "median_us, noise_us, samples, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
      tim.bind(1, id);
      tim.bind(2, c.config.elems_per_load);
      tim.bind(3, c.config.warps);
      tim.bind(4, c.config.stages);
      tim.bind(5, c.config.programs_per_sm);
      tim.bind(6, c.median_us);
      tim.bind(7, c.noise_us);
      tim.bind(8, c.samples);
      tim.bind(9, c.status);
      tim.exec();
    }
  }
  for (int i = 0; i < 4; ++i) {
    const KernelImage k = make_image(i);
    std::string names;
    for (const auto& n : k.lowered_names) names += (names.empty() ? "" : "\n") + n;
    SQLite::Statement ins(db, "INSERT INTO kernels (arch, code_version, variant, nvrtc_version, options, is_cubin, "
                              "lowered_names, image, checksum, library_version, created_at) "
                              "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, '0.1.0', 1764000000)");
    const KernelKey& key = g_kernels[static_cast<std::size_t>(i)];
    ins.bind(1, key.arch);
    ins.bind(2, key.code_version);
    ins.bind(3, key.variant);
    ins.bind(4, k.nvrtc_version);
    ins.bind(5, k.options);
    ins.bind(6, k.is_cubin ? 1 : 0);
    ins.bind(7, names);
    ins.bind(8, static_cast<const void*>(k.image.data()), static_cast<int>(k.image.size()));
    ins.bind(9, gnsilu::cache::kernel_checksum(k.image, names));
    ins.exec();
  }
  // The same lease as the current template's: held by another process for a day from start-up.
  db.exec("INSERT INTO leases (key, owner, expires_at) VALUES ('lease-key', 'owner-a', "
          "CAST(strftime('%s', 'now') AS REAL) + 86400)");
  t.commit();
}

// The real files the inputs start from.
void make_templates() {
  for (int i = 0; i < 8; ++i) g_keys.push_back(make_key(i));
  // Twins of key 0 that differ from it only in the layout, or only in the activation.
  g_keys.push_back(make_key(0));
  g_keys.back().layout = Layout::ChannelsLast;
  g_keys.push_back(make_key(0));
  g_keys.back().activation = Activation::None;
  for (int i = 0; i < 6; ++i) g_kernels.push_back(make_kernel_key(i));
  remove_files();
  {
    Store s(g_path, Store::Mode::ReadWrite, 1000);
    if (!s.writable()) {
      std::fprintf(stderr, "fuzz_cache_file: cannot make a cache in %s: %s\n", g_dir.c_str(), s.problem().c_str());
      std::abort();
    }
    for (int i = 0; i < 5; ++i) s.put_tuning(make_entry(g_keys[static_cast<std::size_t>(i)], i));
    s.put_tuning(make_entry(g_keys[8], 5));  // key 0's channels-last twin, beside it
    for (int i = 0; i < 4; ++i) s.put_kernel(g_kernels[static_cast<std::size_t>(i)], make_image(i));
    s.claim("lease-key", "owner-a", 86400);  // held by another process for the longest lease allowed, a day
  }
  g_templates.push_back(read_file(g_path));  // 0: WAL mode, current schema
  g_bundle = gnsilu::cache::read_bundle(g_path);
  const std::string exported = gnsilu::cache::export_text(g_bundle);
  {
    SQLite::Database db(g_path, SQLite::OPEN_READWRITE);
    db.exec("PRAGMA journal_mode = DELETE");
  }
  g_templates.push_back(read_file(g_path));  // 1: rollback journal
  remove_files();
  Store::create_at_version(g_path, 1);
  g_templates.push_back(read_file(g_path));  // 2: schema 1 (migrated when opened read-write)
  remove_files();
  {
    SQLite::Database db(g_path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("CREATE TABLE songs (title TEXT); INSERT INTO songs VALUES ('x')");
  }
  g_templates.push_back(read_file(g_path));  // 3: not a gnsilu cache
  remove_files();
  g_templates.push_back(Bytes(exported.begin(), exported.end()));  // 4: an export file (JSON)
  make_schema_2({0, 1, 2});
  g_templates.push_back(read_file(g_path));  // 5: schema 2 with entries (migrated when opened read-write)
  remove_files();
  {
    // The schema-2 template must be one this gnsilu upgrades with its entries, and reads through a copy.
    write_file(g_path, g_templates[5]);
    const auto copy = Store::read_upgraded(g_path);
    Store s(g_path, Store::Mode::ReadWrite, 1000);
    if (copy->all_tuning().size() != 3 || s.all_tuning().size() != 3 || !s.find_tuning(g_keys[1])) {
      std::fprintf(stderr, "fuzz_cache_file: the schema-2 template does not migrate: %s\n", s.problem().c_str());
      std::abort();
    }
  }
  remove_files();
  for (const auto& t : g_templates) {
    if (t.size() < 512) {
      std::fprintf(stderr, "fuzz_cache_file: a template is only %zu bytes\n", t.size());
      std::abort();
    }
  }
}

// Offsets of the SQLite header's fields (https://www.sqlite.org/fileformat.html), for targeted patches.
constexpr uint32_t kHeaderFields[] = {16, 18, 19, 20, 21, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 92, 96, 100};

// Empty: schema 1, migrated when opened read-write. Populated: a cache with the template's entries and lease (the
// current schema, or schema 2 migrated when opened read-write).
enum class Start { Mutated, Populated, Empty };

// The file's bytes from the input: a template or the input's own bytes, then patches.
Bytes make_file(Input& in, Start& start) {
  const uint8_t base = in.u8() % 8;
  Bytes file;
  if (base < 4) {
    file = g_templates[base];
  } else if (base == 4) {
    file = in.bytes(in.u16());
  } else if (base == 6) {
    file = g_templates[4];
  } else if (base == 7) {
    file = g_templates[5];
  }  // else: an empty file
  start = base < 2 || base == 7 ? Start::Populated : base == 2 ? Start::Empty : Start::Mutated;
  const int patches = in.u8() % 17;
  for (int i = 0; i < patches && !in.empty(); ++i) {
    start = Start::Mutated;
    const uint8_t kind = in.u8() % 6;
    const std::size_t at = file.empty() ? 0 : in.u32() % file.size();
    switch (kind) {
      case 0:  // one byte
        if (!file.empty()) file[at] = in.u8();
        break;
      case 1: {  // a run of bytes
        const Bytes run = in.bytes(in.u8());
        for (std::size_t j = 0; j < run.size() && at + j < file.size(); ++j) file[at + j] = run[j];
        break;
      }
      case 2: {  // a big-endian header field
        const uint32_t field = kHeaderFields[in.u8() % std::size(kHeaderFields)];
        const uint32_t value = in.flag() ? in.u8() : in.u32();
        for (int b = 0; b < 4 && field + b < file.size(); ++b) file[field + b] = static_cast<uint8_t>(value >> (24 - 8 * b));
        break;
      }
      case 3:  // truncated
        file.resize(at);
        break;
      case 4: {  // appended
        const Bytes more = in.bytes(in.u16() % 8192);
        file.insert(file.end(), more.begin(), more.end());
        break;
      }
      default:  // a byte of a page's b-tree header (page starts are multiples of 4096 here)
        if (file.size() > 4096) {
          const std::size_t page = at / 4096 * 4096 + (at < 4096 ? 100 : 0);
          const std::size_t off = page + in.u8() % 12;
          if (off < file.size()) file[off] = in.u8();
        }
        break;
    }
  }
  return file;
}

// Arguments.
TuningKey any_key(Input& in) {
  const uint8_t sel = in.u8();
  if (sel < 200) return g_keys[sel % g_keys.size()];
  TuningKey k = g_keys[sel % g_keys.size()];
  k.device.name = in.text(40);
  k.device.arch = in.i32();
  k.code_version = in.text(20);
  k.channels_per_group = in.i64();
  k.x_dtype = static_cast<DType>(in.u8() % 4);
  k.size_class = in.text(12);
  // 2: a value no name stands for (put_tuning refuses such a key).
  k.layout = static_cast<Layout>(in.u8() % 3);
  k.activation = static_cast<Activation>(in.u8() % 3);
  return k;
}

TuningEntry any_entry(Input& in) {
  TuningEntry e = make_entry(any_key(in), in.u8() % 8);
  if (in.flag()) {
    e.winner = {in.i32(), in.i32(), in.i32(), in.i32()};
    e.default_us = in.f64();
    e.tuned_shape.dims.resize(in.u8() % 6);
    for (auto& d : e.tuned_shape.dims) d = in.i64();
    e.tuned_shape.groups = in.i64();
    e.tuned_shape.path = static_cast<gnsilu::Path>(in.u8() % 4);  // 3: a value no name stands for
    e.candidates.resize(in.u8() % 5);
  }
  return e;
}

KernelKey any_kernel_key(Input& in) {
  const uint8_t sel = in.u8();
  if (sel < 200) return g_kernels[sel % g_kernels.size()];
  return {in.i32(), in.text(20), in.text(30)};
}

KernelImage any_image(Input& in) {
  KernelImage k = make_image(in.u8() % 6);
  if (in.flag()) {
    const Bytes b = in.bytes(in.u16() % 4096);
    k.image.assign(b.begin(), b.end());
    k.lowered_names.resize(in.u8() % 4);
    for (auto& n : k.lowered_names) n = in.text(20);
  }
  return k;
}

enum class Lease { InForce, Unknown };

struct Context {
  Store& store;
  Input& in;
  bool pristine;   // an unmodified gnsilu cache opened read-write: writes must read back
  bool populated;  // ... and the one with the template's entries
  std::map<std::string, std::pair<std::string, Lease>> leases;  // key -> owner, what the file should hold
};

void check_entry(const TuningEntry& e) {
  for (DType d : {e.key.x_dtype, e.key.y_dtype}) {
    REQUIRE(d == DType::None || d == DType::BF16 || d == DType::FP16 || d == DType::FP32, "dtype");
  }
  REQUIRE(e.key.layout == Layout::ChannelsFirst || e.key.layout == Layout::ChannelsLast, "layout");
  REQUIRE(e.key.activation == Activation::SiLU || e.key.activation == Activation::None, "activation");
  for (const auto& c : e.candidates) REQUIRE(c.status.size() < (std::size_t{1} << 30), "status");
}

void check_image(const KernelImage& k) {
  REQUIRE(!k.image.empty(), "an empty kernel image was returned");
  REQUIRE(!k.lowered_names.empty(), "a kernel with no names was returned");
  for (const auto& n : k.lowered_names) REQUIRE(n.find('\n') == std::string::npos, "a name holds a newline");
}

// The calls. Each consumes its arguments from the input and checks what it gets back.
using Operation = void (*)(Context&);
const Operation kOperations[] = {
    [](Context& c) {  // find_tuning
      const bool usable = c.store.usable();
      const auto e = c.store.find_tuning(any_key(c.in));
      if (!usable) REQUIRE(!e, "an unusable store found an entry");
      if (e) check_entry(*e);
    },
    [](Context& c) {  // all_tuning
      const bool usable = c.store.usable();
      const auto all = c.store.all_tuning();
      if (!usable) REQUIRE(all.empty(), "an unusable store listed entries");
      for (const auto& e : all) check_entry(e);
      if (c.populated && c.store.usable()) REQUIRE(!all.empty(), "the template's entries are gone");
    },
    [](Context& c) {  // find_kernel
      const bool usable = c.store.usable();
      const auto k = c.store.find_kernel(any_kernel_key(c.in));
      if (!usable) REQUIRE(!k, "an unusable store found a kernel");
      if (k) check_image(*k);
    },
    [](Context& c) {  // put_tuning, then read back
      const bool writable = c.store.writable();
      const TuningEntry e = any_entry(c.in);
      const bool ok = c.store.put_tuning(e);
      if (!writable) REQUIRE(!ok, "a store that cannot be written saved an entry");
      const bool named = (e.key.layout == Layout::ChannelsFirst || e.key.layout == Layout::ChannelsLast) &&
                         (e.key.activation == Activation::SiLU || e.key.activation == Activation::None);
      const auto& t = e.tuned_shape;
      const bool shaped = static_cast<int>(t.path) >= 0 && static_cast<int>(t.path) <= 2 &&
                          std::all_of(t.dims.begin(), t.dims.end(), [](int64_t d) { return d > 0; });
      if (!shaped) REQUIRE(!ok, "an entry whose tuned shape would not read back was saved");
      if (!named || !shaped) {
        REQUIRE(!ok, "an entry whose layout or activation has no name was saved");
        REQUIRE(c.store.writable() == writable, "a refused key changed whether the store can be written");
      }
      if (ok && c.pristine) {
        const auto back = c.store.find_tuning(e.key);
        REQUIRE(back && back->key == e.key && back->winner == e.winner &&
                    back->candidates.size() == e.candidates.size() && back->tuned_shape == e.tuned_shape,
                "an entry does not read back as written");
      }
    },
    [](Context& c) {  // put_kernel, then read back
      const bool writable = c.store.writable();
      const KernelKey key = any_kernel_key(c.in);
      const KernelImage image = any_image(c.in);
      const bool ok = c.store.put_kernel(key, image);
      if (!writable) REQUIRE(!ok, "a store that cannot be written saved a kernel");
      if (ok && c.pristine) {
        const auto back = c.store.find_kernel(key);
        bool names_plain = !image.lowered_names.empty();
        for (const auto& n : image.lowered_names) names_plain = names_plain && !n.empty() && n.find('\n') == std::string::npos;
        if (!image.image.empty() && names_plain) {
          REQUIRE(back && back->image == image.image && back->lowered_names == image.lowered_names &&
                      back->is_cubin == image.is_cubin,
                  "a kernel does not read back as written");
        }
      }
    },
    [](Context& c) {  // claim
      const std::string key = c.in.flag() ? "lease-key" : c.in.text(16);
      const std::string owner = c.in.flag() ? "owner-b" : c.in.text(8);
      const double seconds = c.in.flag() ? 60.0 : c.in.f64();
      const bool writable = c.store.writable();
      const Store::Claim got = c.store.claim(key, owner, seconds);
      if (!writable) REQUIRE(got == Store::Claim::Unavailable, "a store that cannot be written gave a lease");
      if (!(seconds >= 0.0 && seconds <= 86400.0)) {  // NaN, negative or over a day: refused, nothing written
        REQUIRE(got == Store::Claim::Unavailable, "a lease for " + std::to_string(seconds) + " s was given");
        REQUIRE(c.store.writable() == writable, "a refused lease changed whether the store can be written");
        return;
      }
      if (!c.pristine || !writable) {
        c.pristine = false;
        return;
      }
      const auto it = c.leases.find(key);
      if (it != c.leases.end() && it->second.second == Lease::Unknown) return;  // expiry too close to tell
      const bool held = it != c.leases.end() && it->second.first != owner && it->second.second == Lease::InForce;
      REQUIRE(got == (held ? Store::Claim::HeldByOther : Store::Claim::Acquired),
              "claim of '" + key + "' by '" + owner + "' for " + std::to_string(seconds) + " s");
      if (!held) c.leases[key] = {owner, seconds > 5 ? Lease::InForce : Lease::Unknown};
    },
    [](Context& c) {  // release
      const std::string key = c.in.flag() ? "lease-key" : c.in.text(16);
      const std::string owner = c.in.flag() ? "owner-a" : c.in.text(8);
      c.store.release(key, owner);
      if (const auto it = c.leases.find(key); it != c.leases.end() && it->second.first == owner) c.leases.erase(it);
      if (!c.store.writable()) c.pristine = false;
    },
    [](Context& c) {  // remove_tuning
      const bool writable = c.store.writable();
      const bool ok = c.store.remove_tuning(any_key(c.in));
      if (!writable) REQUIRE(!ok, "a store that cannot be written removed an entry");
      c.populated = false;
    },
    [](Context& c) {  // kernel_count and the state queries
      const int64_t n = c.store.kernel_count();
      REQUIRE(n >= 0, "kernel count");
      if (!c.store.usable()) REQUIRE(n == 0, "an unusable store counted kernels");
      if (c.store.usable()) {
        REQUIRE(c.store.schema_version() == gnsilu::cache::kSchemaVersion,
                "a usable store of schema " + std::to_string(c.store.schema_version()));
      }
    },
    [](Context& c) {  // kernel_keys
      const bool usable = c.store.usable();
      const auto keys = c.store.kernel_keys();
      if (!usable) REQUIRE(keys.empty(), "an unusable store listed kernels");
    },
    [](Context& c) {  // remove_kernel
      const bool writable = c.store.writable();
      const bool ok = c.store.remove_kernel(any_kernel_key(c.in));
      if (!writable) REQUIRE(!ok, "a store that cannot be written removed a kernel");
    },
    [](Context& c) {  // read_bundle: the file as gnsilu-tune import reads it (a cache or an export)
      try {
        const auto b = gnsilu::cache::read_bundle(g_path, c.in.flag());
        for (const auto& e : b.tuning) check_entry(e);
      } catch (const gnsilu::cache::TransferError&) {
      }
    },
    [](Context& c) {  // merge_into: the template's contents, or the file's own, into the store
      const bool from_file = c.in.flag(), dry_run = c.in.flag();
      const bool usable = c.store.usable(), writable = c.store.writable();
      try {
        const gnsilu::cache::Bundle incoming = from_file ? gnsilu::cache::read_bundle(g_path) : g_bundle;
        gnsilu::cache::merge_into(c.store, incoming, dry_run);
        REQUIRE(usable && (dry_run || writable), "merged into a store that cannot take it");
      } catch (const gnsilu::cache::TransferError&) {
      }
      c.populated = c.populated && c.store.usable();
    },
    // Further entry points: one more line here.
};

struct FileState {
  bool exists = false;
  Bytes bytes;
};

FileState snapshot() {
  FileState s;
  struct stat st;
  s.exists = ::stat(g_path.c_str(), &st) == 0;
  if (s.exists) s.bytes = read_file(g_path);
  return s;
}

void require_unchanged(const FileState& before, const char* when) {
  const FileState now = snapshot();
  REQUIRE(now.exists == before.exists, std::string("the file was deleted or created ") + when);
  REQUIRE(now.bytes.size() >= before.bytes.size(),
          std::string("the file was truncated ") + when + " (" + std::to_string(before.bytes.size()) + " -> " +
              std::to_string(now.bytes.size()) + " bytes)");
  REQUIRE(now.bytes == before.bytes, std::string("the file was changed ") + when);
}

void session(Input& in, Store::Mode mode, Start start, int operations) {
  const FileState before = snapshot();
  std::optional<FileState> frozen;  // the file when the store first could not write
  try {
    {
      Store store(g_path, mode, 200);
      const bool read_only = mode == Store::Mode::ReadOnly;
      if (read_only || !store.writable()) frozen = before;
      REQUIRE(!(read_only && store.writable()), "a read-only store is writable");
      const bool pristine = start != Start::Mutated && !read_only;
      if (pristine) REQUIRE(store.writable(), "a template is not writable: " + store.problem());
      Context c{store, in, pristine, pristine && start == Start::Populated, {}};
      if (c.populated) c.leases["lease-key"] = {"owner-a", Lease::InForce};
      static const bool trace = std::getenv("GNSILU_FUZZ_TRACE") != nullptr;
      if (trace) {
        std::fprintf(stderr, "fuzz_cache_file: %s store: usable %d writable %d (%s)\n", read_only ? "read-only" : "read-write",
                     store.usable(), store.writable(), store.problem().c_str());
      }
      for (int i = 0; i < operations && !in.empty(); ++i) {
        const std::size_t op = in.u8() % std::size(kOperations);
        if (trace) std::fprintf(stderr, "fuzz_cache_file:   operation %zu\n", op);
        kOperations[op](c);
        if (frozen) {
          require_unchanged(*frozen, "while the store could not write to it");
        } else if (!store.writable()) {
          // It could write until now: from here on the file stays as it is. (A WAL left by earlier writes is
          // still checkpointed into it when the store closes, so compare the closed file only without one.)
          struct stat st;
          if (::stat((g_path + "-wal").c_str(), &st) != 0 || st.st_size == 0) frozen = snapshot();
        }
        REQUIRE(store.usable() || store.problem().size() > 0, "unusable with no problem stated");
      }
    }
    if (frozen) require_unchanged(*frozen, "after the store closed");
    REQUIRE(snapshot().exists, "the file is gone");
  } catch (const std::exception& e) {
    gnsilu::fuzz::broken("fuzz_cache_file", "an exception escaped", __FILE__, __LINE__, e.what());
  } catch (...) {
    gnsilu::fuzz::broken("fuzz_cache_file", "an exception escaped", __FILE__, __LINE__);
  }
}

void cleanup() {
  remove_files();
  ::rmdir(g_dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (std::getenv("GNSILU_LOG_LEVEL") == nullptr) setenv("GNSILU_LOG_LEVEL", "off", 1);
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gnsilu-fuzz-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("fuzz_cache_file: mkdtemp");
    std::abort();
  }
  g_dir = pattern;
  g_path = g_dir + "/cache.sqlite";
  std::atexit(cleanup);
  make_templates();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  Input in(data, size);
  remove_files();
  Start start = Start::Mutated;
  const Bytes file = make_file(in, start);
  if (std::getenv("GNSILU_FUZZ_TRACE") != nullptr) {
    std::fprintf(stderr, "fuzz_cache_file: a %zu-byte file, %s\n", file.size(),
                 start == Start::Populated ? "a cache template (current or schema 2)"
                 : start == Start::Empty   ? "the schema-1 template"
                                           : "mutated");
  }
  write_file(g_path, file);
  const uint8_t modes = in.u8();
  const int operations = 1 + in.u8() % 12;
  // Read-only first (it must leave the file as it is), then read-write, or only one of them.
  if ((modes & 3) != 2) session(in, Store::Mode::ReadOnly, start, operations);
  if ((modes & 3) != 1) session(in, Store::Mode::ReadWrite, start, operations);
  return 0;
}
