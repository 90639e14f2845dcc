// The portable export format (gnsilu-tune export / import): JSON of tuned entries with every candidate's timing and
// of compiled kernels (base64, with checksums), written as text and parsed back with every problem reported as a
// TransferError naming the source and the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "cache/transfer/bundle.hpp"
#include "cache/entries.hpp"

namespace gnsilu::cache {

constexpr std::string_view kExportFormat = "gnsilu-cache-export";
// 2: keys carry "layout" and "activation". Version 1 files (without them) still read, as nchw / silu; a gnsilu
// that reads only version 1 refuses version 2 files rather than take channels-last or plain GroupNorm entries
// for channels-first GroupNorm+SiLU ones.
// Entries also carry what they were tuned on, typed: "tuned_dims" (an array), "tuned_groups" and "path" ("fused",
// "split"; "auto" when not recorded), beside the display text "tuned_shape" that every version has. They are
// additions that readers of version 2 ignore, so the version stays 2; a file without them (version 1, or 2 as
// written before schema 4) is read through its "tuned_shape" text and the key's size class
// (tuned_shape_from_legacy).
constexpr int kExportVersion = 2;

// The export format's JSON of a key, a launch configuration and a candidate's timing (gnsilu-tune's --json
// output uses the same fields).
nlohmann::json key_json(const TuningKey& key);
nlohmann::json config_json(const LaunchConfig& config);
nlohmann::json candidate_json(const CandidateTiming& candidate);

// The export format as text, and back (`what` names the source in errors). parse_export throws TransferError
// for anything that is not a well-formed export of a known version: wrong types, unknown dtypes, layouts or
// activations, configurations out of range, kernels whose checksum does not match.
std::string export_text(const Bundle& bundle);
Bundle parse_export(std::string_view text, const std::string& what);

}  // namespace gnsilu::cache
