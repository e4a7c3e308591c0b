// Byte-level dataset: deterministic batches, the dp / micro-batch decomposition against the dp=1
// batch, the train/validation split, corpus loading and its errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "common/check.h"
#include "train/data.h"
#include "tests/model/temp_dir.h"

namespace pwm::model {

using namespace ::pwm::train;  // the trainers' toolkit (train/)
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

using testing::error_of;

TextDataset small_dataset() { return TextDataset(generate_corpus(7, 20000), "generated"); }

TEST(DataBatch, SameSeedAndStepGiveSameBytes) {
  const TextDataset ds = small_dataset();
  const auto a = ds.train_batch(42, 5, 8, 32, 0, 1);
  const auto b = ds.train_batch(42, 5, 8, 32, 0, 1);
  ASSERT_EQ(a.size(), 8u * 33u);
  EXPECT_EQ(a, b);
  // A second dataset object over the same bytes agrees too: nothing depends on call history.
  EXPECT_EQ(small_dataset().train_batch(42, 5, 8, 32, 0, 1), a);
  EXPECT_NE(ds.train_batch(42, 6, 8, 32, 0, 1), a);
  EXPECT_NE(ds.train_batch(43, 5, 8, 32, 0, 1), a);
}

TEST(DataBatch, RowsAreWindowsOfTheTrainingSplit) {
  const TextDataset ds = small_dataset();
  const int64_t T = 16;
  const auto batch = ds.train_batch(3, 11, 4, T, 0, 1);
  for (int64_t i = 0; i < 4; ++i) {
    const int64_t off = ds.train_offset(3, 11, i, T);
    ASSERT_GE(off, 0);
    ASSERT_LE(off + T + 1, ds.train_size());
    for (int64_t t = 0; t <= T; ++t)
      EXPECT_EQ(batch[i * (T + 1) + t], static_cast<unsigned char>(ds.bytes()[off + t]));
  }
}

TEST(DataBatch, RowsDifferWithinAStep) {
  const TextDataset ds = small_dataset();
  std::set<int64_t> offsets;
  for (int64_t i = 0; i < 64; ++i) offsets.insert(ds.train_offset(9, 0, i, 32));
  EXPECT_GT(offsets.size(), 60u);
}

// dp ranks and micro-batches, concatenated in (rank, micro) order, are the dp=1 global batch.
TEST(DataBatch, DataParallelAndMicroBatchesSliceTheGlobalBatch) {
  const TextDataset ds = small_dataset();
  const int64_t G = 8, T = 24;
  for (int64_t step : {0, 1, 17}) {
    const auto global = ds.train_batch(5, step, G, T, 0, 1);
    for (int64_t dp : {1, 2, 4}) {
      for (int64_t n_micro : {1, 2}) {
        std::vector<int32_t> joined;
        for (int64_t r = 0; r < dp; ++r) {
          for (int64_t m = 0; m < n_micro; ++m) {
            const RowRange rows = batch_rows(G, r, dp, m, n_micro);
            EXPECT_EQ(rows.size(), G / dp / n_micro);
            const auto part = ds.train_batch(5, step, G, T, r, dp, m, n_micro);
            EXPECT_EQ(part.size(), static_cast<size_t>(rows.size() * (T + 1)));
            joined.insert(joined.end(), part.begin(), part.end());
          }
        }
        EXPECT_EQ(joined, global) << "step " << step << " dp " << dp << " micro " << n_micro;
      }
    }
  }
}

TEST(DataBatch, RowRangesOfRanksAndMicroBatches) {
  EXPECT_EQ(batch_rows(8, 0, 1).begin, 0);
  EXPECT_EQ(batch_rows(8, 0, 1).end, 8);
  EXPECT_EQ(batch_rows(8, 1, 2).begin, 4);
  EXPECT_EQ(batch_rows(8, 3, 4, 1, 2).begin, 7);
  EXPECT_EQ(batch_rows(8, 3, 4, 1, 2).end, 8);
  EXPECT_EQ(batch_rows(12, 1, 2, 2, 3).begin, 10);
}

TEST(DataBatch, IndivisibleBatchIsAClearError) {
  EXPECT_NE(error_of([] { batch_rows(6, 0, 4); }).find("global batch 6 is not divisible by dp=4"),
            std::string::npos);
  EXPECT_NE(error_of([] { batch_rows(8, 0, 2, 0, 3); }).find("not divisible by 3 micro-batches"),
            std::string::npos);
  EXPECT_NE(error_of([] { batch_rows(8, 2, 2); }).find("rank 2 is not in [0, 2)"),
            std::string::npos);
}

// Training rows come only from the first 75% and validation rows only from the last 25%.
TEST(DataSplit, TrainingAndValidationAreDisjoint) {
  const std::string bytes = std::string(750, 'a') + std::string(250, 'b');
  const TextDataset ds(bytes, "ab", 0.25);
  EXPECT_EQ(ds.train_size(), 750);
  EXPECT_EQ(ds.val_size(), 250);
  const int64_t T = 20;
  int64_t max_offset = 0;
  for (int64_t step = 0; step < 200; ++step) {
    for (int32_t tok : ds.train_batch(1, step, 4, T, 0, 1)) ASSERT_EQ(tok, 'a');
    for (int64_t i = 0; i < 4; ++i) max_offset = std::max(max_offset, ds.train_offset(1, step, i, T));
  }
  EXPECT_GT(max_offset, 750 - T - 1 - 20);  // offsets reach close to the end of the split
  ASSERT_GT(ds.num_val_batches(2, T), 0);
  for (int64_t i = 0; i < ds.num_val_batches(2, T); ++i)
    for (int32_t tok : ds.val_batch(i, 2, T)) ASSERT_EQ(tok, 'b');
}

TEST(DataSplit, ValidationWalksTheSplitInOrder) {
  const TextDataset ds = small_dataset();
  const int64_t T = 32, B = 3;
  EXPECT_EQ(ds.num_val_windows(T), (ds.val_size() - 1) / T);
  const int64_t n = ds.num_val_batches(B, T);
  EXPECT_EQ(n, ds.num_val_windows(T) / B);
  ASSERT_GE(n, 2);
  std::vector<int32_t> all;
  for (int64_t i = 0; i < n; ++i) {
    const auto b = ds.val_batch(i, B, T);
    EXPECT_EQ(b, ds.val_batch(i, B, T));
    all.insert(all.end(), b.begin(), b.end());
  }
  // Window w holds val bytes [w*T, w*T + T + 1): each window's last token starts the next one.
  for (int64_t w = 0; w < n * B; ++w)
    for (int64_t t = 0; t <= T; ++t)
      ASSERT_EQ(all[w * (T + 1) + t],
                static_cast<unsigned char>(ds.bytes()[ds.train_size() + w * T + t]));
  // A row range of a validation batch is the matching slice of the whole batch.
  std::vector<int32_t> rows(2 * (T + 1));
  ds.val_batch(1, B, T, 1, 3, rows.data());
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), all.begin() + (B + 1) * (T + 1)));
  EXPECT_NE(error_of([&] { ds.val_batch(n, B, T); }).find("validation batch"), std::string::npos);
}

TEST(DataCorpus, DirectoryConcatenatesRegularFilesByName) {
  TempDir dir;
  write(dir.file("b.txt"), "second file\n");
  write(dir.file("a.txt"), "first file\n");
  write(dir.file("c-empty"), "");
  fs::create_directory(dir.path() / "sub");
  write(dir.file("sub/ignored.txt"), "in a subdirectory\n");
  fs::create_symlink(dir.path() / "a.txt", dir.path() / "d-link-to-a");  // a duplicate: skipped
  const TextDataset ds = TextDataset::open(dir.path().string(), 0.0);
  EXPECT_EQ(ds.bytes(), "first file\nsecond file\n");
  EXPECT_EQ(ds.source(), dir.path().string());
}

TEST(DataCorpus, SingleFileAndSplitFraction) {
  TempDir dir;
  write_generated_corpus(dir.file("corpus.txt"), 3, 10000);
  const TextDataset ds = TextDataset::open(dir.file("corpus.txt"), 0.1);
  EXPECT_EQ(ds.bytes(), generate_corpus(3, 10000));
  EXPECT_EQ(ds.train_size(), 9000);
  EXPECT_EQ(ds.val_size(), 1000);
}

TEST(DataCorpus, MissingEmptyOrShortInputIsAClearError) {
  TempDir dir;
  const std::string missing = dir.file("nope.txt");
  std::string e = error_of([&] { TextDataset::open(missing); });
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_NE(e.find("no such file or directory"), std::string::npos) << e;

  write(dir.file("empty.txt"), "");
  e = error_of([&] { TextDataset::open(dir.file("empty.txt")); });
  EXPECT_NE(e.find("empty.txt: the file is empty"), std::string::npos) << e;

  fs::create_directory(dir.path() / "emptydir");
  e = error_of([&] { TextDataset::open(dir.file("emptydir")); });
  EXPECT_NE(e.find("no non-empty regular files"), std::string::npos) << e;

  write(dir.file("short.txt"), std::string(100, 'x'));
  const TextDataset ds = TextDataset::open(dir.file("short.txt"), 0.1);
  e = error_of([&] { ds.check_fits(128); });
  EXPECT_NE(e.find("short.txt: the training split has 90 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("smaller seq_len"), std::string::npos) << e;
  e = error_of([&] { ds.train_batch(1, 0, 2, 128, 0, 1); });
  EXPECT_NE(e.find("training split has 90 bytes"), std::string::npos) << e;
  e = error_of([&] { ds.check_fits(40); });  // training fits, validation (10 bytes) does not
  EXPECT_NE(e.find("validation split has 10 bytes"), std::string::npos) << e;
  EXPECT_NO_THROW(ds.check_fits(8));

  e = error_of([&] { TextDataset("abc", "mem", 1.0); });
  EXPECT_NE(e.find("validation fraction"), std::string::npos) << e;
}

TEST(DataCorpus, DefaultCorpusIsUsable) {
  const std::string path = default_corpus_path();
  if (!fs::exists(path)) GTEST_SKIP() << path << " is absent on this machine";
  const TextDataset ds = TextDataset::open(path);
  EXPECT_GT(ds.size(), 100000);
  EXPECT_NO_THROW(ds.check_fits(128));
  EXPECT_GT(ds.num_val_batches(8, 128), 0);
}

TEST(DataCorpus, GeneratedCorpusIsDeterministicEnglishLikeText) {
  const std::string a = generate_corpus(1, 5000);
  EXPECT_EQ(a.size(), 5000u);
  EXPECT_EQ(a, generate_corpus(1, 5000));
  EXPECT_EQ(generate_corpus(1, 100), a.substr(0, 100));  // a prefix of a longer corpus
  EXPECT_NE(a, generate_corpus(2, 5000));
  std::set<char> chars(a.begin(), a.end());
  for (char c : chars) EXPECT_TRUE(c == '\n' || c == '.' || c == ' ' || std::isalpha(c)) << c;
  EXPECT_LT(chars.size(), 45u);  // a small alphabet: learnable
  EXPECT_NE(a.find("The "), std::string::npos);
  EXPECT_NE(a.find('.'), std::string::npos);
  EXPECT_NE(a.find('\n'), std::string::npos);
  EXPECT_TRUE(generate_corpus(1, 0).empty());
}

}  // namespace
}  // namespace pwm::model
