// What a program may open or write, checked before it does (train/bootstrap.h runs these on every
// rank, so every rank makes the same decision and none blocks opening what another refused).
//
// Inputs: a path must name a regular file (a FIFO, a device or a socket would block open(2) or
// read forever) of at most a given size; a directory is refused unless the caller allows it.
// Outputs: two paths alias when they resolve to the same file (symbolic links, "./", "../" and
// hard links included), and a path is inside a directory when its resolved parent is the
// directory or below it. None of these open the file; all throw pwm::Error with one line naming
// the flag, or return a plain answer.
#pragma once

#include <cstdint>
#include <string>

namespace pwm {

// What PATH is when it is not a regular file: "a directory", "a FIFO (named pipe)", "a character
// device", ... ("not a regular file" for the rest); "a regular file" otherwise; "" if it cannot be
// stat'ed. Does not open it.
std::string file_kind(const std::string& path);

// Throws pwm::Error (one line: `what`, PATH and the fix) unless PATH is a regular file of at
// most `max_bytes` (or, with `directory_ok`, a directory).
void check_input_file(const std::string& what, const std::string& path, uintmax_t max_bytes,
                      bool directory_ok = false);

// PATH made absolute with every symbolic link resolved; for a file that does not exist yet, its
// resolved parent directory joined with its name. "" if the parent does not exist either.
std::string resolved_path(const std::string& path);

// Whether A and B name the same file: the same device and inode when both exist, else the same
// resolved path.
bool same_file(const std::string& a, const std::string& b);

// Whether PATH (existing or not) lies in directory DIR or below it.
bool inside_directory(const std::string& path, const std::string& dir);

// "12.0 MiB", "3 bytes": a size for messages.
std::string size_text(uintmax_t bytes);

}  // namespace pwm
