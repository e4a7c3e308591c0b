// Byte-level text data for the trainers: a corpus split into training and validation bytes, and
// batches that are a pure function of (seed, step), so every decomposition sees the same data.
//
// Tokens are bytes (vocab 256) widened to int32. A batch row is a window of seq_len + 1
// consecutive tokens: inputs are row[0, T), targets are row[1, T + 1).
//
// Determinism contract (docs/checkpoint-format.md relies on it): the GLOBAL training batch of a
// step is `global_batch` rows; row i starts at an offset drawn from a counter-based RNG of
// (seed, step, i) over the training split. A data-parallel rank or a micro-batch asks for a
// contiguous range of rows of that global batch, so dp = N with any micro-batching consumes
// exactly the rows dp = 1 does, and resuming needs only the step: there is no data cursor to
// checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pwm::train {

// Half-open range of rows [begin, end) of a global batch.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The rows of micro-batch `micro` (of `n_micro`) of data-parallel rank `dp_rank` (of `dp_size`):
// rank r owns rows [r*G/dp, (r+1)*G/dp) and cuts them into n_micro consecutive equal pieces.
// Throws pwm::Error with one line if G is not divisible by dp_size or G/dp_size by n_micro.
RowRange batch_rows(int64_t global_batch, int64_t dp_rank, int64_t dp_size, int64_t micro = 0,
                    int64_t n_micro = 1);

class TextDataset {
 public:
  // Reads PATH: a regular file, or a directory whose regular files (not subdirectories) are
  // concatenated in byte order of their names. A symlink in the directory is read unless it
  // points at a file already read (/usr/share/common-licenses has GPL -> GPL-3 and the like).
  // The last `val_fraction` of the bytes (rounded down) form the validation split, the rest the
  // training split. Missing, unreadable or empty input throws pwm::Error naming the path.
  static TextDataset open(const std::string& path, double val_fraction = 0.1);
  // The bytes open(path) would read, from the files' sizes without opening them: the run checks
  // it against the memory it has before any rank reads. Throws open()'s errors for a missing,
  // special or unlistable path.
  static uint64_t size_on_disk(const std::string& path);

  // Same, from bytes in memory; `source` names them in error messages.
  TextDataset(std::string bytes, std::string source, double val_fraction = 0.1);

  const std::string& source() const { return source_; }
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  int64_t train_size() const { return train_size_; }  // training split: bytes [0, train_size)
  int64_t val_size() const { return size() - train_size_; }  // validation: [train_size, size)

  // Throws pwm::Error (one line naming the source and the fix) unless both splits hold at least
  // one window of seq_len + 1 tokens. Trainers call it once at start-up; the batch functions
  // call it too.
  void check_fits(int64_t seq_len) const;

  // Rows [row_begin, row_end) of the global training batch of `step`.
  // out: (row_end - row_begin) x (seq_len + 1) int32, row-major, written completely.
  void train_batch(uint64_t seed, int64_t step, int64_t global_batch, int64_t seq_len,
                   int64_t row_begin, int64_t row_end, int32_t* out) const;
  // Convenience: the rows batch_rows(global_batch, dp_rank, dp_size, micro, n_micro) names.
  std::vector<int32_t> train_batch(uint64_t seed, int64_t step, int64_t global_batch,
                                   int64_t seq_len, int64_t dp_rank, int64_t dp_size,
                                   int64_t micro = 0, int64_t n_micro = 1) const;

  // The start of row `row` of step `step` within the training split (exposed for tests).
  int64_t train_offset(uint64_t seed, int64_t step, int64_t row, int64_t seq_len) const;

  // Validation walks the split in order: window w covers val bytes [w*T, w*T + T + 1), and
  // validation batch `index` is windows [index*B, (index+1)*B), B = batch. Every window is used
  // by at most one batch; the tail that does not fill a batch is left out.
  int64_t num_val_windows(int64_t seq_len) const;
  int64_t num_val_batches(int64_t batch, int64_t seq_len) const;
  // Rows [row_begin, row_end) of validation batch `index` (0 <= index < num_val_batches), so
  // data-parallel ranks can split an evaluation batch exactly as they split a training batch.
  // out: (row_end - row_begin) x (seq_len + 1) int32.
  void val_batch(int64_t index, int64_t batch, int64_t seq_len, int64_t row_begin,
                 int64_t row_end, int32_t* out) const;
  std::vector<int32_t> val_batch(int64_t index, int64_t batch, int64_t seq_len) const;

  // Raw bytes (training split followed by validation split).
  const std::string& bytes() const { return bytes_; }

 private:
  void copy_window(int64_t offset, int64_t seq_len, int32_t* out) const;

  std::string bytes_;
  std::string source_;
  int64_t train_size_ = 0;
};

// The real corpus every Debian machine carries: /usr/share/common-licenses (about 250 KB of
// license texts: 14 distinct files, 237,320 bytes on Debian 12 once symlinks are folded).
std::string default_corpus_path();

// A learnable English-like corpus of exactly `bytes` bytes: sentences over a fixed vocabulary of
// about 60 words with a small grammar (determiner, adjective, noun, verb, preposition phrase),
// a paragraph break every few sentences. Deterministic in `seed`.
std::string generate_corpus(uint64_t seed, size_t bytes);
// Writes generate_corpus(seed, bytes) to PATH (throws pwm::Error on I/O failure).
void write_generated_corpus(const std::string& path, uint64_t seed, size_t bytes);

}  // namespace pwm::train
