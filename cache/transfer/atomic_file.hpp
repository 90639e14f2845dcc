// Writing a file atomically: the contents go to a temporary file beside it (the path + ".tmp" + the process id),
// which is then renamed over the path, so a reader sees the old file or the new one, never part of one.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace gnsilu::detail {

// Writes `contents` to `path` atomically. Returns what went wrong, without the path ("cannot be created (TEMP
// could not be opened for writing)", "writing failed (disk full?)", "cannot be replaced (rename failed)"), or
// nothing on success. A temporary file that was created is removed on failure.
std::optional<std::string> write_file_atomically(const std::string& path, std::string_view contents);

}  // namespace gnsilu::detail
