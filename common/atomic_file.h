// Output files that are either complete or absent: every result, metrics, trace and checkpoint
// file goes through AtomicFile.
//
// The bytes go to PATH.tmp.<pid> in PATH's directory; every write(2) and the final fsync(2) and
// close(2) are checked; only then is the temporary file renamed onto PATH (and the directory
// fsynced). Any failure throws pwm::Error with one line naming PATH and the cause ("No space
// left on device"), removes the temporary file, and leaves PATH as it was.
//
// While a temporary file exists its name is in a process-wide registry (fixed slots, no
// allocation), and SIGINT / SIGTERM handlers installed with the first AtomicFile unlink every
// registered name, put back the previous disposition and re-raise the signal: a Ctrl-C or the
// launcher's SIGTERM after an MPI_Abort leaves no *.tmp.<pid> behind. (SIGKILL cannot be caught:
// a killed rank can still leave one, which the next run with the same pid overwrites.)
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pwm {

class AtomicFile {
 public:
  // Creates PATH.tmp.<pid> (truncating a stale one). Throws pwm::Error naming `what` (e.g.
  // "--metrics", "checkpoint") and PATH when it cannot be created.
  AtomicFile(std::string path, std::string what);
  // Not committed: closes and removes the temporary file (never throws).
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Buffered; throws pwm::Error on the first failed write(2) (the file is then discarded, and
  // every later call throws the same error).
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Pushes the buffer to the kernel (a reader of the temporary file sees every byte so far).
  void flush();
  // flush + fsync + close + rename onto PATH + fsync of the directory. Throws pwm::Error (the
  // temporary file removed, PATH untouched) on any failure.
  void commit();
  // Closes and removes the temporary file now (idempotent).
  void discard() noexcept;

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  bool open() const { return fd_ >= 0; }
  uint64_t bytes_written() const { return written_; }

 private:
  [[noreturn]] void fail(const std::string& op, int err);

  std::string path_, what_, tmp_;
  int fd_ = -1;
  int slot_ = -1;  // in the temporary-file registry
  std::string buf_;
  uint64_t written_ = 0;
  std::string error_;  // the first failure, repeated by later calls
};

// Writes `contents` to PATH through an AtomicFile; `what` names it in messages.
void write_file_atomic(const std::string& path, const std::string& contents,
                       const std::string& what = "output");

// Pre-run check of an output PATH given by `flag` (e.g. "--metrics", "PWM_PW_TRACE"): throws
// pwm::Error with one line if PATH is a directory or another non-regular file, if its parent
// directory is missing, or if a file cannot be created there (probed by creating and removing
// PATH.tmp.<pid>).
void check_output_path(const std::string& flag, const std::string& path);

namespace temp_files {
// The registry itself, for code that creates temporary files without AtomicFile. add() returns
// a slot (or -1 when all 64 are taken: the file is then simply not cleaned up on a signal);
// remove(slot) forgets it. Both are thread-safe; the signal handler only reads.
int add(const std::string& path);
void remove(int slot) noexcept;
// How many names are registered now (tests).
int live();
}  // namespace temp_files

}  // namespace pwm
