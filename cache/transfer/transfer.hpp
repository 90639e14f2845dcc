// Moving cache contents between files and machines (gnsilu-tune export / import / merge): a portable export
// file (export_format.hpp: JSON of tuned entries with every candidate's timing, compiled kernels in base64 with
// checksums), reading either an export file or a SQLite cache file, and merging with conflicts resolved toward the
// better-measured entry (merge.hpp). Everything here reports bad input as TransferError (bundle.hpp) naming the file
// and what is wrong with it. This header is the one its users include: it brings in the other three.
#pragma once

#include <optional>
#include <string>

#include "cache/transfer/bundle.hpp"
#include "cache/entries.hpp"
#include "cache/transfer/export_format.hpp"
#include "cache/transfer/merge.hpp"

namespace gnsilu::cache {

class Store;

// Everything `store` holds (kernels only when `with_kernels`).
// Kernels of a file that fails the trust check (trust.hpp) are left out unless `untrusted_kernels` (for
// inspecting them: gnsilu-tune verify --kernels).
Bundle bundle_of(Store& store, bool with_kernels, bool untrusted_kernels = false);

// An export file or a SQLite cache file (told apart by the first bytes; a cache file of an older schema is read
// through an upgraded copy in memory, Store::read_upgraded). Throws TransferError.
Bundle read_bundle(const std::string& path, bool with_kernels = true, bool untrusted_kernels = false);

// Writes an export file atomically (a temporary file renamed over `path`: atomic_file.hpp). Throws
// TransferError.
void write_export(const Bundle& bundle, const std::string& path);

// Entries (and kernels) of `bundle` that a machine with `device` (none: any) running kernels of `code_version`
// cannot use, moved out of `bundle` into the returned bundle.
Bundle take_mismatched(Bundle& bundle, const std::optional<DeviceIdentity>& device, const std::string& code_version);

}  // namespace gnsilu::cache
