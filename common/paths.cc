#include "common/paths.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"

namespace pwm {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "a special file";
}

std::string real(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

}  // namespace

std::string file_kind(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? kind_of(st.st_mode) : "";
}

std::string size_text(uintmax_t bytes) {
  constexpr double MiB = 1024.0 * 1024.0;
  if (bytes < 1024 * 1024) return fmt::format("{} bytes", bytes);
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / MiB);
}

void check_input_file(const std::string& what, const std::string& path, uintmax_t max_bytes, bool directory_ok) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    PWM_THROW("{} {}: {}; check the path", what, path, std::strerror(errno));
  if (S_ISDIR(st.st_mode) && directory_ok) return;
  if (!S_ISREG(st.st_mode))
    PWM_THROW("{} {} is {}, not a regular file: pass a file{}", what, path, kind_of(st.st_mode),
              directory_ok ? " or a directory of files" : "");
  if (static_cast<uintmax_t>(st.st_size) > max_bytes)
    PWM_THROW("{} {} is {}, more than this run can read ({} at most): check the path", what, path,
              size_text(static_cast<uintmax_t>(st.st_size)), size_text(max_bytes));
}

std::string resolved_path(const std::string& path) {
  if (path.empty()) return "";
  if (std::string r = real(path); !r.empty()) return r;
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string d = real(dir);
  if (d.empty()) return "";
  return d == "/" ? "/" + name : d + "/" + name;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  const std::string ra = resolved_path(a), rb = resolved_path(b);
  return !ra.empty() && ra == rb;
}

bool inside_directory(const std::string& path, const std::string& dir) {
  const std::string p = resolved_path(path), d = real(dir);
  if (p.empty() || d.empty()) return false;
  if (d == "/") return true;
  return p.size() > d.size() && p.compare(0, d.size(), d) == 0 && p[d.size()] == '/';
}

}  // namespace pwm
