#include "common/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "common/check.h"

namespace pwm {

// ---- The registry of live temporary files and the signal handler that removes them ----------
//
// The handler may run on any thread at any moment, so it touches only lock-free atomics and
// fixed char arrays, and calls only unlink, sigaction and raise (all async-signal-safe). A slot
// is claimed (kClaimed) while its name is copied in and becomes visible to the handler only when
// marked kLive (release / acquire), so the handler never reads a half-written name.

namespace {

constexpr int kSlots = 64;
constexpr size_t kMaxPath = 4096;
enum : int { kFree = 0, kClaimed = 1, kLive = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  char path[kMaxPath];
};
Slot g_slots[kSlots];
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

constexpr int kSignals[] = {SIGINT, SIGTERM};
struct sigaction g_previous[sizeof(kSignals) / sizeof(kSignals[0])];

void on_signal(int sig) {
  const int saved_errno = errno;
  for (Slot& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == kLive) ::unlink(s.path);
  // Put back what was there before us and deliver the signal again: the default action ends the
  // process with the signal's status, as if we had never been installed; a chained handler
  // (the MPI library's) runs.
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i)
    if (kSignals[i] == sig) ::sigaction(sig, &g_previous[i], nullptr);
  ::raise(sig);
  errno = saved_errno;
}

void install_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
      struct sigaction sa {};
      sa.sa_handler = on_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      struct sigaction old {};
      if (::sigaction(kSignals[i], nullptr, &old) != 0) continue;
      g_previous[i] = old;
      // A signal the process ignores (SIGINT in a background job) stays ignored.
      if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue;
      ::sigaction(kSignals[i], &sa, nullptr);
    }
  });
}

std::string errno_text(int err) { return std::strerror(err); }

std::string parent_dir(const std::string& path) {
  const std::filesystem::path p = std::filesystem::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

}  // namespace

namespace temp_files {

int add(const std::string& path) {
  install_handlers();
  if (path.size() + 1 > kMaxPath) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(kLive, std::memory_order_release);
    return i;
  }
  return -1;
}

void remove(int slot) noexcept {
  if (slot >= 0 && slot < kSlots) g_slots[slot].state.store(kFree, std::memory_order_release);
}

int live() {
  int n = 0;
  for (const Slot& s : g_slots) n += s.state.load(std::memory_order_acquire) == kLive;
  return n;
}

}  // namespace temp_files

// ---- AtomicFile ---------------------------------------------------------------------------

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)), tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())) {
  // Registered before it exists, so that no signal can fall between creation and registration.
  slot_ = temp_files::add(tmp_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    temp_files::remove(slot_);
    slot_ = -1;
    PWM_THROW("{} {}: cannot create {}: {}; check that the directory exists and is writable", what_, path_, tmp_,
              errno_text(err));
  }
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_.c_str());
  }
  temp_files::remove(slot_);
  slot_ = -1;
}

void AtomicFile::fail(const std::string& op, int err) {
  discard();
  error_ = fmt::format("{} {}: {}: {}; nothing was written to {}", what_, path_, op, errno_text(err), path_);
  throw Error(error_);
}

void AtomicFile::write(const void* data, size_t n) {
  if (!error_.empty()) throw Error(error_);
  PWM_CHECK(fd_ >= 0, "{} {}: write after commit", what_, path_);
  constexpr size_t kBuf = 1 << 20;
  buf_.append(static_cast<const char*>(data), n);
  if (buf_.size() >= kBuf) flush();
}

void AtomicFile::flush() {
  if (!error_.empty()) throw Error(error_);
  const char* p = buf_.data();
  size_t n = buf_.size();
  while (n > 0) {
    const ssize_t k = ::write(fd_, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      const int err = errno;  // before any allocation below
      fail("cannot write " + tmp_, err);
    }
    p += k;
    n -= static_cast<size_t>(k);
    written_ += static_cast<uint64_t>(k);
  }
  buf_.clear();
}

void AtomicFile::commit() {
  flush();
  if (::fsync(fd_) != 0) {
    const int err = errno;
    fail("cannot fsync " + tmp_, err);
  }
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    fail("cannot close " + tmp_, err);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    fail("cannot rename " + tmp_ + " onto it", err);
  }
  temp_files::remove(slot_);
  slot_ = -1;
  // The rename is durable only once the directory entry is on disk. Some filesystems cannot
  // fsync a directory (EINVAL): nothing more can be done there.
  const std::string dir = parent_dir(path_);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) PWM_THROW("{} {}: cannot open directory {} to fsync it: {}", what_, path_, dir, errno_text(errno));
  const int drc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (drc != 0 && err != EINVAL) PWM_THROW("{} {}: fsync of directory {} failed: {}", what_, path_, dir, errno_text(err));
}

void write_file_atomic(const std::string& path, const std::string& contents, const std::string& what) {
  AtomicFile f(path, what);
  f.write(contents);
  f.commit();
}

void check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) PWM_THROW("{} is empty: name a file", flag);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      PWM_THROW("{} {} is a directory: name a file (e.g. {}/out)", flag, path, path);
    if (!S_ISREG(st.st_mode)) PWM_THROW("{} {} exists and is not a regular file: name a file", flag, path);
  }
  const std::string dir = parent_dir(path);
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0)
    PWM_THROW("{} {}: the directory {} does not exist: create it or choose another path", flag, path, dir);
  if (!S_ISDIR(dst.st_mode)) PWM_THROW("{} {}: {} is not a directory", flag, path, dir);
  // A probe: the same temporary name the writer will use, created and removed at once.
  try {
    AtomicFile probe(path, flag);
  } catch (const Error&) {
    PWM_THROW("{} {}: cannot create a file in {} (check that it is writable)", flag, path, dir);
  }
}

}  // namespace pwm
