#include "cache/trust.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

namespace gnsilu::cache {
namespace {

std::string octal(mode_t mode) {
  std::ostringstream out;
  out << std::oct << (mode & 07777);
  return out.str();
}

// Empty when `what` at `path` (stat'ed into st) passes, else the problem.
std::string check(const std::string& path, const struct stat& st, bool folder, bool file_owned_safely) {
  const uid_t me = geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return std::string(folder ? "its folder " : "it ") + "is owned by uid " + std::to_string(st.st_uid) +
           ", not by this user (" + std::to_string(me) + ") or root";
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    if (folder && (st.st_mode & S_ISVTX) != 0 && file_owned_safely) return "";  // /tmp-like: others cannot replace it
    return std::string(folder ? "its folder " + path : std::string("it")) + " is writable by " +
           ((st.st_mode & S_IWOTH) != 0 ? "others" : "its group") + " (mode " + octal(st.st_mode) + ")";
  }
  return "";
}

}  // namespace

bool trust_check_disabled() {
  const char* v = std::getenv("GNSILU_CACHE_TRUST");
  return v != nullptr && std::strcmp(v, "any") == 0;
}

CodeTrust code_trust(const std::string& path) {
  CodeTrust t;
  if (trust_check_disabled()) return t;
  struct stat file {};
  if (stat(path.c_str(), &file) != 0) return t;  // not there yet: created by this user
  std::string problem = check(path, file, false, true);
  if (problem.empty()) {
    std::filesystem::path folder = std::filesystem::path(path).parent_path();
    if (folder.empty()) folder = ".";
    struct stat dir {};
    if (stat(folder.c_str(), &dir) != 0) {
      problem = "its folder " + folder.string() + " cannot be checked (" + std::strerror(errno) + ")";
    } else {
      problem = check(folder.string(), dir, true, file.st_uid == geteuid() || file.st_uid == 0);
    }
  }
  if (!problem.empty()) {
    t.trusted = false;
    t.problem = problem;
  }
  return t;
}

}  // namespace gnsilu::cache
