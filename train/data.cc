#include "train/data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/check.h"
#include "common/paths.h"

namespace pwm::train {

namespace {

namespace fs = std::filesystem;

// splitmix64's finalizer: a bijection on 64 bits with full avalanche.
uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Counter-based RNG: the value depends on (seed, step, row) only, never on how many values were
// drawn before, which is what lets any rank compute any row of any step.
uint64_t counter_rng(uint64_t seed, uint64_t step, uint64_t row) {
  return mix64(mix64(mix64(seed) ^ step) ^ row);
}

// Uniform in [0, n) by Lemire's multiply-shift (bias below n / 2^64, irrelevant here).
uint64_t below(uint64_t r, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
}

const char* kDataHint = "pass a text file or a directory of text files";

void append_file(const fs::path& path, std::string* out) {
  // O_NONBLOCK: a FIFO put in place after the check above must not block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    PWM_THROW("data {}: cannot open: {}; {}", path.string(), std::strerror(errno), kDataHint);
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      PWM_THROW("data {}: cannot read: {}; {}", path.string(), std::strerror(err), kDataHint);
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
}

// The files a directory contributes, sorted by name; symlinks whose target is a file already in
// the list are dropped so the same text is not read twice.
std::vector<fs::path> directory_files(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (fs::is_regular_file(it->path(), ec2)) entries.push_back(it->path());
  }
  if (ec) PWM_THROW("data {}: cannot list directory: {}; {}", dir.string(), ec.message(), kDataHint);
  std::sort(entries.begin(), entries.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });

  std::set<fs::path> seen;  // canonical paths of the plain files, then of the symlinks kept
  for (const auto& p : entries) {
    std::error_code ec2;
    if (!fs::is_symlink(p, ec2)) seen.insert(fs::canonical(p, ec2));
  }
  std::vector<fs::path> files;
  for (const auto& p : entries) {
    std::error_code ec2;
    if (fs::is_symlink(p, ec2)) {
      const fs::path target = fs::canonical(p, ec2);
      if (ec2 || !seen.insert(target).second) continue;
    }
    files.push_back(p);
  }
  return files;
}

}  // namespace

RowRange batch_rows(int64_t global_batch, int64_t dp_rank, int64_t dp_size, int64_t micro,
                    int64_t n_micro) {
  if (global_batch <= 0) PWM_THROW("batch: global batch must be positive (got {})", global_batch);
  if (dp_size <= 0 || dp_rank < 0 || dp_rank >= dp_size)
    PWM_THROW("batch: data-parallel rank {} is not in [0, {})", dp_rank, dp_size);
  if (n_micro <= 0 || micro < 0 || micro >= n_micro)
    PWM_THROW("batch: micro-batch {} is not in [0, {})", micro, n_micro);
  if (global_batch % dp_size != 0)
    PWM_THROW("batch: global batch {} is not divisible by dp={}; choose a global batch that is a "
              "multiple of {}",
              global_batch, dp_size, dp_size);
  const int64_t local = global_batch / dp_size;
  if (local % n_micro != 0)
    PWM_THROW("batch: the per-rank batch {} (global {} / dp {}) is not divisible by {} "
              "micro-batches; choose a global batch that is a multiple of {}",
              local, global_batch, dp_size, n_micro, dp_size * n_micro);
  const int64_t m = local / n_micro;
  const int64_t begin = dp_rank * local + micro * m;
  return {begin, begin + m};
}

namespace {

// The status of a data path, refused in one line unless it is a regular file or a directory.
fs::file_status data_path_status(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      PWM_THROW("data {}: cannot access: {}; {}", path, ec.message(), kDataHint);
    PWM_THROW("data {}: no such file or directory; {} (the default corpus is {})", path,
              kDataHint, default_corpus_path());
  }
  // Never open a FIFO, socket or device: opening a FIFO blocks until a writer appears, and a
  // device may never end. fs::status does not open the path.
  if (!fs::is_directory(st) && !fs::is_regular_file(st))
    PWM_THROW("data {}: is {}, not a regular file; {}", path, file_kind(path), kDataHint);
  return st;
}

}  // namespace

uint64_t TextDataset::size_on_disk(const std::string& path) {
  const fs::file_status st = data_path_status(path);
  const std::vector<fs::path> files = fs::is_directory(st) ? directory_files(path) : std::vector<fs::path>{path};
  uint64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const uintmax_t n = fs::file_size(f, ec);
    if (ec) PWM_THROW("data {}: cannot read the size of {}: {}; {}", path, f.string(), ec.message(), kDataHint);
    total += n;
  }
  return total;
}

TextDataset TextDataset::open(const std::string& path, double val_fraction) {
  const fs::file_status st = data_path_status(path);
  std::string bytes;
  if (fs::is_directory(st)) {
    for (const auto& f : directory_files(path)) append_file(f, &bytes);
    if (bytes.empty())
      PWM_THROW("data {}: the directory holds no non-empty regular files; {}", path, kDataHint);
  } else {
    append_file(path, &bytes);
    if (bytes.empty()) PWM_THROW("data {}: the file is empty; {}", path, kDataHint);
  }
  return TextDataset(std::move(bytes), path, val_fraction);
}

TextDataset::TextDataset(std::string bytes, std::string source, double val_fraction)
    : bytes_(std::move(bytes)), source_(std::move(source)) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    PWM_THROW("data {}: validation fraction must be in [0, 1) (got {})", source_, val_fraction);
  if (bytes_.empty()) PWM_THROW("data {}: no bytes; {}", source_, kDataHint);
  const auto n = static_cast<int64_t>(bytes_.size());
  const auto val = static_cast<int64_t>(std::floor(static_cast<double>(n) * val_fraction));
  train_size_ = n - val;
}

void TextDataset::check_fits(int64_t seq_len) const {
  if (seq_len <= 0) PWM_THROW("data {}: seq_len must be positive (got {})", source_, seq_len);
  if (train_size_ < seq_len + 1)
    PWM_THROW("data {}: the training split has {} bytes, fewer than the {} (seq_len + 1) one "
              "sequence needs; use a larger corpus or a smaller seq_len",
              source_, train_size_, seq_len + 1);
  if (val_size() > 0 && val_size() < seq_len + 1)
    PWM_THROW("data {}: the validation split has {} bytes, fewer than the {} (seq_len + 1) one "
              "sequence needs; use a larger corpus, a larger validation fraction or a smaller "
              "seq_len",
              source_, val_size(), seq_len + 1);
}

void TextDataset::copy_window(int64_t offset, int64_t seq_len, int32_t* out) const {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes_.data()) + offset;
  for (int64_t t = 0; t <= seq_len; ++t) out[t] = static_cast<int32_t>(p[t]);
}

int64_t TextDataset::train_offset(uint64_t seed, int64_t step, int64_t row, int64_t seq_len) const {
  PWM_CHECK_GE(step, 0);
  PWM_CHECK_GE(row, 0);
  // Valid starts are 0 .. train_size - (seq_len + 1): train_size - seq_len of them.
  const auto starts = static_cast<uint64_t>(train_size_ - seq_len);
  return static_cast<int64_t>(
      below(counter_rng(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(row)), starts));
}

void TextDataset::train_batch(uint64_t seed, int64_t step, int64_t global_batch, int64_t seq_len,
                              int64_t row_begin, int64_t row_end, int32_t* out) const {
  check_fits(seq_len);
  PWM_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= global_batch,
            "rows [{}, {}) of a global batch of {}", row_begin, row_end, global_batch);
  for (int64_t i = row_begin; i < row_end; ++i)
    copy_window(train_offset(seed, step, i, seq_len), seq_len, out + (i - row_begin) * (seq_len + 1));
}

std::vector<int32_t> TextDataset::train_batch(uint64_t seed, int64_t step, int64_t global_batch,
                                              int64_t seq_len, int64_t dp_rank, int64_t dp_size,
                                              int64_t micro, int64_t n_micro) const {
  const RowRange r = batch_rows(global_batch, dp_rank, dp_size, micro, n_micro);
  std::vector<int32_t> out(static_cast<size_t>(r.size() * (seq_len + 1)));
  train_batch(seed, step, global_batch, seq_len, r.begin, r.end, out.data());
  return out;
}

int64_t TextDataset::num_val_windows(int64_t seq_len) const {
  PWM_CHECK_GT(seq_len, 0);
  if (val_size() < seq_len + 1) return 0;
  return (val_size() - 1) / seq_len;  // last window starts at w*T with w*T + T + 1 <= val_size
}

int64_t TextDataset::num_val_batches(int64_t batch, int64_t seq_len) const {
  PWM_CHECK_GT(batch, 0);
  return num_val_windows(seq_len) / batch;
}

void TextDataset::val_batch(int64_t index, int64_t batch, int64_t seq_len, int64_t row_begin,
                            int64_t row_end, int32_t* out) const {
  const int64_t n = num_val_batches(batch, seq_len);
  if (index < 0 || index >= n)
    PWM_THROW("data {}: validation batch {} does not exist: the validation split ({} bytes) holds "
              "{} batches of {} x {} tokens",
              source_, index, val_size(), n, batch, seq_len);
  PWM_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= batch,
            "rows [{}, {}) of a validation batch of {}", row_begin, row_end, batch);
  for (int64_t i = row_begin; i < row_end; ++i)
    copy_window(train_size_ + (index * batch + i) * seq_len, seq_len,
                out + (i - row_begin) * (seq_len + 1));
}

std::vector<int32_t> TextDataset::val_batch(int64_t index, int64_t batch, int64_t seq_len) const {
  std::vector<int32_t> out(static_cast<size_t>(batch * (seq_len + 1)));
  val_batch(index, batch, seq_len, 0, batch, out.data());
  return out;
}

std::string default_corpus_path() { return "/usr/share/common-licenses"; }

// ---- Generated corpus ---------------------------------------------------------------------
//
// Sentences follow  S -> NP VP '.' ;  NP -> Det [Adj] Noun ;  VP -> Vt NP [PP] | Vi PP ;
// PP -> Prep NP. Each noun prefers one transitive verb (half of the time), so a model can learn
// more than word frequencies: spelling, the grammar, and the noun -> verb association.

namespace {

constexpr const char* kDet[] = {"the", "a", "every", "this", "that", "my", "one", "no"};
constexpr const char* kAdj[] = {"small", "red", "old", "happy", "quiet", "bright",
                                "cold",  "green", "tall", "slow", "brave", "lazy"};
constexpr const char* kNoun[] = {"cat",   "dog",   "bird",  "child", "farmer", "river",
                                 "house", "tree",  "boat",  "teacher", "garden", "king",
                                 "horse", "baker", "stone", "letter"};
constexpr const char* kVt[] = {"saw",    "found",  "liked", "followed", "painted",
                               "helped", "carried", "watched", "built", "heard"};
constexpr const char* kVi[] = {"sat", "slept", "ran", "waited", "sang", "stood"};
constexpr const char* kPrep[] = {"on", "under", "near", "behind", "beside", "with", "into"};

template <size_t N>
const char* pick(const char* const (&words)[N], uint64_t r) {
  return words[below(r, N)];
}

class SeqRng {
 public:
  explicit SeqRng(uint64_t seed) : state_(mix64(seed ^ 0x636f72707573ULL)) {}
  uint64_t next() { return mix64(state_++); }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }

 private:
  uint64_t state_;
};

// Appends a noun phrase and returns the index of its noun.
size_t noun_phrase(SeqRng& rng, std::string* s) {
  *s += pick(kDet, rng.next());
  if (rng.chance(0.4)) {
    *s += ' ';
    *s += pick(kAdj, rng.next());
  }
  const size_t noun = below(rng.next(), std::size(kNoun));
  *s += ' ';
  *s += kNoun[noun];
  return noun;
}

void sentence(SeqRng& rng, std::string* out) {
  std::string s;
  const size_t subject = noun_phrase(rng, &s);
  s += ' ';
  if (rng.chance(0.75)) {
    s += rng.chance(0.5) ? kVt[subject % std::size(kVt)] : pick(kVt, rng.next());
    s += ' ';
    noun_phrase(rng, &s);
    if (rng.chance(0.3)) {
      s += ' ';
      s += pick(kPrep, rng.next());
      s += ' ';
      noun_phrase(rng, &s);
    }
  } else {
    s += pick(kVi, rng.next());
    s += ' ';
    s += pick(kPrep, rng.next());
    s += ' ';
    noun_phrase(rng, &s);
  }
  s[0] = static_cast<char>(s[0] - 'a' + 'A');
  s += '.';
  *out += s;
}

}  // namespace

std::string generate_corpus(uint64_t seed, size_t bytes) {
  SeqRng rng(seed);
  std::string out;
  out.reserve(bytes + 128);
  int64_t in_paragraph = 0, paragraph_len = 4 + static_cast<int64_t>(below(rng.next(), 5));
  while (out.size() < bytes) {
    sentence(rng, &out);
    if (++in_paragraph == paragraph_len) {
      out += '\n';
      in_paragraph = 0;
      paragraph_len = 4 + static_cast<int64_t>(below(rng.next(), 5));
    } else {
      out += ' ';
    }
  }
  out.resize(bytes);
  return out;
}

void write_generated_corpus(const std::string& path, uint64_t seed, size_t bytes) {
  const std::string text = generate_corpus(seed, bytes);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) PWM_THROW("corpus {}: cannot create: {}", path, std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      PWM_THROW("corpus {}: cannot write: {}", path, std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) PWM_THROW("corpus {}: cannot write: {}", path, std::strerror(errno));
}

}  // namespace pwm::train
