// Cache contents in and out of files: a store's contents as a bundle, reading an export file or a SQLite cache
// file, writing an export file, and setting apart entries another machine cannot use (transfer.hpp). The format
// itself is export_format.cpp, the merge policy merge.cpp.
#include "cache/transfer/transfer.hpp"

#include <fstream>
#include <iterator>
#include <utility>

#include "cache/transfer/atomic_file.hpp"
#include "cache/store.hpp"

namespace gnsilu::cache {

Bundle bundle_of(Store& store, bool with_kernels, bool untrusted_kernels) {
  Bundle b;
  b.tuning = store.all_tuning();
  if (with_kernels) {
    for (const auto& key : store.kernel_keys()) {
      if (auto image = untrusted_kernels ? store.read_kernel(key) : store.find_kernel(key))
        b.kernels.push_back({key, std::move(*image)});
    }
  }
  return b;
}

Bundle read_bundle(const std::string& path, bool with_kernels, bool untrusted_kernels) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TransferError(path, "cannot be opened for reading");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw TransferError(path, "read failed");
  constexpr std::string_view kSqliteMagic("SQLite format 3\0", 16);
  if (text.size() >= kSqliteMagic.size() && std::string_view(text).substr(0, kSqliteMagic.size()) == kSqliteMagic) {
    // A file of an older schema is read through an upgraded copy in memory: an input is never changed.
    const auto store = Store::read_upgraded(path);
    if (!store->usable()) throw TransferError(path, store->problem());
    Bundle b = bundle_of(*store, with_kernels, untrusted_kernels);
    if (!store->usable()) throw TransferError(path, store->problem());
    return b;
  }
  Bundle b = parse_export(text, path);
  if (!with_kernels) b.kernels.clear();
  return b;
}

void write_export(const Bundle& bundle, const std::string& path) {
  if (const auto problem = detail::write_file_atomically(path, export_text(bundle))) {
    throw TransferError(path, *problem);
  }
}

Bundle take_mismatched(Bundle& bundle, const std::optional<DeviceIdentity>& device, const std::string& code_version) {
  Bundle out;
  std::vector<TuningEntry> keep;
  for (auto& e : bundle.tuning) {
    const bool usable = e.key.code_version == code_version && (!device || e.key.device == *device);
    (usable ? keep : out.tuning).push_back(std::move(e));
  }
  bundle.tuning = std::move(keep);
  std::vector<KernelRecord> keep_kernels;
  for (auto& k : bundle.kernels) {
    const bool usable = k.key.code_version == code_version && (!device || k.key.arch == device->arch);
    (usable ? keep_kernels : out.kernels).push_back(std::move(k));
  }
  bundle.kernels = std::move(keep_kernels);
  return out;
}

}  // namespace gnsilu::cache
