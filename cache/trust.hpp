// Whether the compiled kernels of a cache file may be loaded. A cache file's kernels are code that gnsilu runs on
// the GPU inside the caller's process, and a checksum catches damage, not tampering (a writer can compute it
// too), so kernels are loaded only from a file that nobody but the user (or root) could have written: the file
// and its folder owned by the user or root and not writable by group or others (as ssh treats keys). A folder
// writable by others with the sticky bit (/tmp) is accepted for a file owned by the user or root: nobody else
// can replace the file there. A file that fails the check still gives its tuning entries (a configuration cannot
// change output bits); its kernels are compiled again with NVRTC instead. GNSILU_CACHE_TRUST=any turns the check
// off (for setups whose files are shared by a group on purpose).
#pragma once

#include <string>

namespace gnsilu::cache {

struct CodeTrust {
  bool trusted = true;
  std::string problem;  // why not ("" when trusted): names the file or folder, the owner or mode, and the fix
};

// The check for `path` (a file that does not exist yet is trusted: it will be created by this user, 0600).
CodeTrust code_trust(const std::string& path);

// Whether GNSILU_CACHE_TRUST=any switched the check off.
bool trust_check_disabled();

}  // namespace gnsilu::cache
