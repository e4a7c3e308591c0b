// Replays a fuzz target without libFuzzer, as a normal program of every build:
//   <target>_replay [--write-seeds DIR] [FILE|DIR]...
// runs the target's seeds, then every FILE and every file in each DIR, through
// LLVMFuzzerTestOneInput (a finding aborts). --write-seeds writes the seeds to DIR (the fuzzer's
// starting corpus) and exits. A missing FILE or DIR fails: a regression test must not pass by
// finding nothing.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "tests/fuzz/fuzz.h"

namespace fs = std::filesystem;

namespace {

void run(const std::string& bytes) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  const auto seeds = pwm_fuzz_seeds();
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    fs::create_directories(argv[2]);
    for (const auto& [name, bytes] : seeds) std::ofstream(fs::path(argv[2]) / name, std::ios::binary) << bytes;
    std::cout << "wrote " << seeds.size() << " seeds to " << argv[2] << "\n";
    return 0;
  }
  for (const auto& [name, bytes] : seeds) run(bytes);
  size_t files = 0;
  for (int i = 1; i < argc; ++i) {
    const fs::path p = argv[i];
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file() && e.path().filename() != "README.md") {
          std::cout << "replaying " << e.path().string() << std::endl;
          run(read(e.path()));
          ++files;
        }
    } else if (fs::is_regular_file(p)) {
      run(read(p));
      ++files;
    } else {
      std::cerr << "replay: " << p.string() << " is neither a file nor a directory\n";
      return 1;
    }
  }
  std::cout << "replayed " << seeds.size() << " seeds and " << files << " files: no finding\n";
  return 0;
}
