// Issue 17's "nothing is lost" at the level of one process: AtomicFile (complete or absent, the
// temporary file removed on an error and on SIGTERM), the pre-run checks of output paths,
// configurations and memory, the metrics file, and the checkpoint reader's tensor table.
#include <gtest/gtest.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "common/trace.h"
#include "common/memory.h"
#include "common/check.h"
#include "train/checkpoint.h"
#include "train/checks.h"
#include "train/full_state.h"
#include "train/config.h"
#include "train/report.h"
#include "tests/model/temp_dir.h"

namespace pwm::model {

using namespace ::pwm::train;  // the trainers' toolkit (train/)
namespace {

using testing::error_of;
using testing::TempDir;
namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(AtomicFile, CompleteOnCommitAbsentOtherwise) {
  TempDir dir;
  const std::string path = dir.file("out.txt");
  {
    AtomicFile f(path, "test");
    f.write("hello ");
    f.flush();
    EXPECT_EQ(dir.listing(), (std::vector<std::string>{"out.txt.tmp." + std::to_string(::getpid())}));
    EXPECT_EQ(temp_files::live(), 1);
    f.write("world");
    f.commit();
  }
  EXPECT_EQ(slurp(path), "hello world");
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"out.txt"}));
  EXPECT_EQ(temp_files::live(), 0);
  {
    AtomicFile f(path, "test");  // not committed: the old contents stay, the temporary goes
    f.write("partial");
  }
  EXPECT_EQ(slurp(path), "hello world");
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"out.txt"}));
  EXPECT_EQ(temp_files::live(), 0);
}

TEST(AtomicFile, FailedRenameNamesThePathAndLeavesNothing) {
  TempDir dir;
  fs::create_directory(dir.path() / "taken");
  const std::string e = error_of([&] { write_file_atomic(dir.file("taken"), "x", "--metrics"); });
  EXPECT_NE(e.find("--metrics " + dir.file("taken") + ": cannot rename"), std::string::npos) << e;
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"taken"}));
  EXPECT_EQ(temp_files::live(), 0);
}

TEST(AtomicFile, SigtermRemovesTheTemporaryFileAndStillKills) {
  TempDir dir;
  const std::string path = dir.file("big.bin");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // never returns into gtest
    try {
      AtomicFile f(path, "test");
      f.write(std::string(1 << 16, 'x'));
      f.flush();
      ::raise(SIGTERM);
    } catch (...) {
    }
    ::_exit(3);  // not reached: the handler re-raises with the default action
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  EXPECT_TRUE(dir.listing().empty()) << dir.listing().front();
}

TEST(OutputPaths, DirectoriesMissingParentsAndSpecialFilesAreRefused) {
  TempDir dir;
  fs::create_directory(dir.path() / "d");
  std::string e = error_of([&] { check_output_path("--metrics", dir.file("d")); });
  EXPECT_NE(e.find("--metrics " + dir.file("d") + " is a directory"), std::string::npos) << e;
  e = error_of([&] { check_output_path("--ckpt", dir.file("no/x.ckpt")); });
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  e = error_of([&] { check_output_path("--trace", dir.file("fifo")); });
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { check_output_path("--trace", dir.file("t.json")); }), "(no error)");
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"d", "fifo"}));  // the probe left nothing
}

TEST(TrainConfigAgreement, TheDifferingRankAndFieldAreNamed) {
  TrainConfig a, b;
  b.model.seed = 2;
  b.exec.bucket_bytes = 50000;
  EXPECT_NE(config_hash(a.canonical_json()), config_hash(b.canonical_json()));
  EXPECT_EQ(config_hash(a.canonical_json()), config_hash(TrainConfig{}.canonical_json()));
  const std::string e = error_of([&] { check_same_config({a.canonical_json(), a.canonical_json(), b.canonical_json()}); });
  EXPECT_NE(e.find("rank 2 started with other flags than rank 0"), std::string::npos) << e;
  EXPECT_NE(e.find("bucket_bytes=50000 vs 0"), std::string::npos) << e;
  EXPECT_NE(e.find("model/seed=2 vs 1234"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { check_same_config({a.canonical_json(), a.canonical_json()}); }), "(no error)");
  // A trainer's own settings take part.
  TrainConfig chained = a;
  chained.mpmd.granularity = Granularity::kChained;
  EXPECT_NE(a.canonical_json(/*mpmd=*/true), chained.canonical_json(/*mpmd=*/true));
}

TEST(TrainConfigValidate, StepsAndKillRankAreNamedAsFlags) {
  TrainConfig c;
  c.workload.steps = -3;
  c.optim.total_steps = -3;
  EXPECT_NE(error_of([&] { c.validate(1); }).find("--steps must be at least 1 (got -3)"), std::string::npos);
  c = TrainConfig{};
  c.hooks.kill_step = 1;
  c.hooks.kill_rank = 4;
  EXPECT_NE(error_of([&] { c.validate_kill_rank(4); }).find("--kill-rank 4 is not a rank"), std::string::npos);
  EXPECT_EQ(error_of([&] { c.validate_kill_rank(5); }), "(no error)");
}

TEST(MemoryCheck, AHugeSequenceIsRefusedWithBothNumbers) {
  TrainConfig c;
  EXPECT_LT(estimated_memory_bytes(c), 1e9);  // the reference model fits anywhere
  EXPECT_EQ(error_of([&] { check_memory(c, 2); }), "(no error)");
  c.model.seq_len = 10'000'000;
  EXPECT_GT(estimated_memory_bytes(c), 1e15);  // the T x T scores alone
  const std::string e = error_of([&] { check_memory(c, 2); });
  EXPECT_NE(e.find("needs about"), std::string::npos) << e;
  EXPECT_NE(e.find("GiB available"), std::string::npos) << e;
}

TEST(TrainReport, MetricsAppearOnlyWhenComplete) {
  TempDir dir;
  TrainConfig c;
  c.outputs.metrics = dir.file("m.jsonl");
  c.workload.steps = 1;
  {
    TrainReport r(c, "test", 1, Peak::given(1.0), true);
    StepRecord s;
    s.compute_ms = s.comm_ms = s.wait_ms = {1.0};
    r.step(s);
    EXPECT_FALSE(fs::exists(c.outputs.metrics));
    EXPECT_FALSE(r.failed());
  }  // never finished: nothing at all
  EXPECT_TRUE(dir.listing().empty());
  TrainReport r(c, "test", 1, Peak::given(1.0), true);
  r.finish("0");
  EXPECT_NE(slurp(c.outputs.metrics).find("\"final\":true"), std::string::npos);
}

// Issue 39: MFU never exceeds 100%. A step faster than the peak raises the peak to its rate (and
// the final line says so); probes only raise it; the final line carries the peak used.
TEST(TrainReport, TheGemmPeakIsNeverBelowAnAchievedRate) {
  TempDir dir;
  TrainConfig c;
  c.outputs.metrics = dir.file("m.jsonl");
  c.workload.steps = 3;
  const double fpt = c.model.flops_per_token(), tokens = static_cast<double>(c.tokens_per_step());
  auto gflops = [&](double step_ms) { return tokens / (step_ms * 1e-3) * fpt / 2 / 1e9; };  // 2 ranks
  const double probe = 1.5 * gflops(20);  // between the rates of a 20 ms step and a 10 ms one
  TrainReport r(c, "test", 2, Peak::probed(probe), true);
  r.probed(0.5 * probe);  // a slower probe does not lower the peak
  EXPECT_EQ(r.peak().gflops(), probe);
  EXPECT_EQ(r.peak().source(), "model-shape GEMM, highest of 2 probes");
  StepRecord s;
  s.compute_ms = s.comm_ms = s.wait_ms = {1.0, 1.0};
  for (double ms : {20.0, 10.0, 20.0}) {
    s.step_ms = ms;
    r.step(s);
    EXPECT_LE(r.mfu(r.tokens_per_s(ms)), 1.0);
    ++s.step;
  }
  EXPECT_EQ(r.peak().gflops(), gflops(10));
  EXPECT_TRUE(r.peak().raised());
  r.finish("0");
  std::vector<nlohmann::json> lines;
  std::istringstream in(slurp(c.outputs.metrics));
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 5u);  // header, 3 steps, final
  EXPECT_EQ(lines[0]["peak_gflops_per_rank"], probe);  // the header: the start-up peak
  EXPECT_EQ(lines[2]["mfu"], 1.0);  // the step that set the peak
  const nlohmann::json& f = lines[4];
  EXPECT_EQ(f["peak_gflops_per_rank"], gflops(10));
  EXPECT_EQ(f["mfu"], gflops(20) / gflops(10));  // the median step against the highest rate
  EXPECT_EQ(f["peak_source"],
            fmt::format("achieved step rate, above the model-shape GEMM's highest of 2 probes, {:.1f} GFLOP/s", probe));
  EXPECT_EQ(f["peak_probes"], 2);
  EXPECT_EQ(f["peak_probe_gflops_per_rank"], probe);
  // --peak-gflops: no probes; below the achieved rate, raised the same way.
  Peak given = Peak::given(10);
  EXPECT_EQ(given.source(), "--peak-gflops");
  EXPECT_FALSE(given.achieved(9));
  EXPECT_TRUE(given.achieved(12));
  EXPECT_EQ(given.gflops(), 12);
  EXPECT_EQ(given.source(), "achieved step rate, above --peak-gflops 10");
}

// Issue 42: a non-finite step is skipped while --skip-nonfinite allows (its line marked, the
// final loss the last finite one), the next one stops the run: no line for it, and stop() ends
// the metrics with the stopped line and moves them into place.
TEST(TrainReport, NonFiniteStepsAreSkippedThenStopTheRun) {
  TempDir dir;
  TrainConfig c;
  c.outputs.metrics = dir.file("m.jsonl");
  c.workload.steps = 4;
  c.workload.skip_nonfinite = 1;
  c.optim.lr = 0.5;
  TrainReport r(c, "test", 1, Peak::given(1.0), true);
  StepRecord s;
  s.compute_ms = s.comm_ms = s.wait_ms = {1.0};
  s.loss = 2.5;
  s.grad_norm = 1;
  r.step(s);
  s.step = 1;
  s.loss = 3.0;
  s.grad_norm = std::numeric_limits<double>::infinity();  // a finite loss, an infinite norm: skipped
  r.step(s);
  EXPECT_FALSE(r.stopped());
  EXPECT_EQ(r.skipped_nonfinite(), 1);
  EXPECT_EQ(r.last_loss(), 2.5);
  s.step = 2;
  s.loss = std::numeric_limits<double>::quiet_NaN();
  r.step(s);
  ASSERT_TRUE(r.stopped());
  const std::string line = r.stop();
  EXPECT_EQ(line, "step 2: the training loss is nan (gradient norm inf), after 1 skipped non-finite step "
                  "(--skip-nonfinite 1): training diverged or the data/precision produced a non-finite value; "
                  "lower --lr (now 0.5), or check the data");
  std::vector<nlohmann::json> lines;
  std::istringstream in(slurp(c.outputs.metrics));
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 4u);  // header, step 0, step 1 (skipped), the stopped line
  EXPECT_FALSE(lines[1]["skipped"].get<bool>());
  EXPECT_TRUE(lines[2]["skipped"].get<bool>());
  EXPECT_TRUE(lines[2]["grad_norm"].is_null());
  EXPECT_TRUE(lines[3]["stopped"].get<bool>());
  EXPECT_EQ(lines[3]["step"], 2);
  EXPECT_EQ(lines[3]["skipped_nonfinite"], 1);
  EXPECT_EQ(lines[3]["error"], line);
  EXPECT_TRUE(dir.listing().size() == 1);  // no temporary file left
}

// Moves the tensor table entry of params tensor `name` to `offset` (same number of digits, so
// the header keeps its length) and recomputes the CRC: a well-formed file with a forged table.
std::string with_offset(std::string bytes, const std::string& name, uint64_t offset) {
  uint32_t header = 0;
  std::memcpy(&header, bytes.data() + 12, 4);
  const std::string text = bytes.substr(32, header);
  const auto h = nlohmann::json::parse(text);
  for (const auto& e : h.at("tensors"))
    if (e.at("name") == name && e.at("group") == "params") {
      const std::string from = "\"offset\":" + std::to_string(e.at("offset").get<uint64_t>());
      const std::string to = "\"offset\":" + std::to_string(offset);
      EXPECT_EQ(from.size(), to.size());
      const size_t at = bytes.find(from, 32 + text.find("\"name\":\"" + name + "\""));
      bytes.replace(at, from.size(), to);
    }
  const uint32_t crc = checkpoint_crc32(0, bytes.data(), bytes.size() - 4);
  std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
  return bytes;
}

TEST(CheckpointRead, OverlappingTensorsAreRefused) {
  TempDir dir;
  Checkpoint c;
  c.params = {{"a", {256, 32}, std::vector<float>(256 * 32, 1.0f)}, {"b", {16}, std::vector<float>(16, 2.0f)}};
  const std::string path = dir.file("x.ckpt");
  save_checkpoint(path, c);
  EXPECT_EQ(error_of([&] { load_checkpoint(path); }), "(no error)");
  // "b" sits after "a" at 32768; move it into the middle of "a" (the CRC recomputed).
  const std::string forged = with_offset(slurp(path), "b", 10240);
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << forged; }
  const std::string e = error_of([&] { load_checkpoint(path); });
  EXPECT_NE(e.find("overlap"), std::string::npos) << e;
}

// The busiest expert-parallel device's rows over the mean, worked by hand: E = 4, calls of 8
// choices each. Call 0 routes [3, 1, 2, 2], call 1 [5, 1, 1, 1]. Over 2 devices (experts 0-1,
// 2-3) the loads are 4 | 4 and 6 | 2: busiest 4 + 6 = 10 against a mean of 16 / 2 = 8, 1.25 (the
// experts' own max/mean, of their sums 8, 2, 3, 3, is 2). Over 4 devices: (3 + 5) / 4 = 2; one
// device: 1. The calls' order, as ranks or devices add them, does not change it.
TEST(MoeRecordTest, DeviceImbalanceIsTheBusiestDevicesRowsOverTheMean) {
  MoeStats a, b;
  a.choices = b.choices = 8;
  a.expert_tokens = a.call_tokens = {3, 1, 2, 2};
  b.expert_tokens = b.call_tokens = {5, 1, 1, 1};
  TrainConfig cfg;
  cfg.model.experts = 4;
  MoeStats ab = a, ba = b;
  ab.add(b);
  ba.add(a);
  for (const auto& [ep, want] : std::vector<std::pair<int, double>>{{1, 1.0}, {2, 1.25}, {4, 2.0}}) {
    cfg.mesh.ep = ep;
    const MoeRecord r = moe_record(pack_moe_stats(ab, 4), cfg);
    EXPECT_DOUBLE_EQ(r.device_max_mean, want) << "ep " << ep;
    EXPECT_DOUBLE_EQ(r.max_mean_tokens, 2.0);
    EXPECT_EQ(moe_record(pack_moe_stats(ba, 4), cfg).device_max_mean, r.device_max_mean) << "ep " << ep;
  }
  // A pack whose call words are not whole calls of E experts is refused.
  std::vector<double> bad = pack_moe_stats(ab, 4);
  bad.pop_back();
  EXPECT_THROW(moe_record(bad, cfg), pwm::Error);
}

}  // namespace
}  // namespace pwm::model

// common/memory.h against memory this test touches itself: 64 MiB written page by page must
// show in the resident set now and in its high-water mark (the kernel counts touched pages).
TEST(Memory, ResidentBytesSeeTouchedPages) {
  const int64_t peak0 = pwm::peak_resident_bytes(), now0 = pwm::current_resident_bytes();
  ASSERT_GT(peak0, 0);
  ASSERT_GT(now0, 0);
  constexpr size_t kBytes = 64 << 20;
  std::vector<char> block(kBytes);
  for (size_t i = 0; i < kBytes; i += 4096) block[i] = static_cast<char>(i);
  const int64_t now1 = pwm::current_resident_bytes(), peak1 = pwm::peak_resident_bytes();
  EXPECT_GE(now1 - now0, static_cast<int64_t>(kBytes) * 9 / 10);
  EXPECT_GE(peak1, now1 - (1 << 20));  // the high-water mark is at least what is resident now
  EXPECT_GE(peak1, peak0);
  EXPECT_EQ(block[4096], static_cast<char>(4096));
}

// common/trace.h: the events come back in order, as JSON, across pages (one event larger than a
// page included), and recording them leaves no block in malloc's heap (glibc's count of bytes in
// use; a sanitizer's allocator does not keep it, so the second half runs without one).
TEST(Trace, EventsComeBackInOrderAndLeaveTheHeapAsItWas) {
  constexpr int kEvents = 20000;  // ~2 MB of text: three pages
  const std::string big_args = "{\"s\":\"" + std::string(3 << 20, 'x') + "\"}";
  const auto record = [&](pwm::Trace& t) {
    t.process_name("rank \"0\"");
    for (int i = 0; i < kEvents; ++i) t.span(fmt::format("k{}", i), "kernel", 1000 + i, 1010 + i, i % 3);
    t.span("big", "kernel", 5, 6, 0, big_args);
    t.counter("live", "bytes", 7, 2.5);
  };
  pwm::Trace t(true, 3, 1000);
  record(t);
  const auto doc = nlohmann::json::parse("[" + t.fragment() + "]");
  ASSERT_EQ(doc.size(), static_cast<size_t>(2 + kEvents + 2));
  EXPECT_EQ(doc[0]["args"]["name"], "rank \"0\"");
  for (int i = 0; i < kEvents; ++i) {
    ASSERT_EQ(doc[2 + i]["name"], fmt::format("k{}", i));
    ASSERT_EQ(doc[2 + i]["ts"], i);
    ASSERT_EQ(doc[2 + i]["tid"], i % 3);
  }
  EXPECT_EQ(doc[2 + kEvents]["args"]["s"].get<std::string>().size(), size_t{3} << 20);
  EXPECT_EQ(doc[3 + kEvents]["args"]["bytes"], 2.5);
  EXPECT_EQ(t.text_bytes(), t.fragment().size());
  pwm::Trace off(false, 0, 0);
  record(off);
  EXPECT_EQ(off.fragment(), "");
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "heap counts need glibc's allocator";
#else
  pwm::Trace heap(true, 1, 0);
  const size_t before = mallinfo2().uordblks;
  record(heap);
  // The only heap block left is the list of pages (a few dozen bytes a page); one block per
  // event, as before, was over 2 MB.
  EXPECT_LT(mallinfo2().uordblks - before, size_t{4096});
#endif
}
