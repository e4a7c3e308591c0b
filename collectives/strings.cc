#include "collectives/strings.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common/check.h"
#include "common/hash.h"

namespace pwm::collectives {

std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(n);
  comm.allgather(&len, lens.data(), 1, DataType::kInt64);
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  // Pad to whole int64 words so the gather can use a fixed count.
  const size_t words = static_cast<size_t>((max_len + 7) / 8);
  std::vector<int64_t> send(std::max<size_t>(words, 1), 0), recv(std::max<size_t>(words, 1) * n, 0);
  std::memcpy(send.data(), mine.data(), mine.size());
  comm.allgather(send.data(), recv.data(), words, DataType::kInt64);
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r)
    out[r].assign(reinterpret_cast<const char*>(recv.data() + r * words), static_cast<size_t>(lens[r]));
  return out;
}

std::vector<std::string> gather_if_different(Communicator& comm, const std::string& mine) {
  int64_t word = static_cast<int64_t>(fnv1a64(mine));  // the same bits on every rank
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  comm.allgather(&word, all.data(), 1, DataType::kInt64);
  if (std::all_of(all.begin(), all.end(), [&](int64_t x) { return x == all[0]; })) return {};
  return allgather_strings(comm, mine);
}

bool agree_on_errors(Communicator& comm, const std::string& program, const std::function<void()>& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::exception& e) {
    err = error_line(e);
    if (err.empty()) err = "unknown error";
  }
  for (const std::string& e : allgather_strings(comm, err))
    if (!e.empty()) {
      if (comm.rank() == 0) {
        std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.c_str());
        std::fflush(stderr);
      }
      return false;
    }
  return true;
}

}  // namespace pwm::collectives
