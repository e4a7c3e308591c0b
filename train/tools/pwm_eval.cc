// pwm_eval: loads a checkpoint (train/checkpoint.h) and prints the model's loss on a text file
// (bytes are tokens; windowing in train/eval.h). One process, one thread.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "common/check.h"
#include "common/cli.h"
#include "common/paths.h"
#include "train/checkpoint.h"
#include "train/eval.h"
#include "model/params.h"

namespace {

using namespace pwm::model;
using namespace pwm::train;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) PWM_THROW("cannot open text file {}", path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

int run(int argc, char** argv) {
  CLI::App app{"pwm_eval: loss of a checkpoint on a text file"};
  std::string ckpt_path, text_path;
  int64_t batch = 8, max_windows = 0;
  bool precise = false;
  app.add_option("--checkpoint", ckpt_path, "checkpoint file")->required();
  app.add_option("--text", text_path, "text file to evaluate on (bytes are tokens)")->required();
  app.add_option("--batch", batch, "windows per forward pass")->capture_default_str();
  app.add_option("--max-windows", max_windows, "evaluate at most this many windows (0: all)");
  app.add_flag("--precise", precise,
               "print the losses with 17 significant digits (the double round-trips: compare at 1e-7 and below)");
  if (int code = 0; !pwm::parse_command_line(app, argc, argv, "pwm_eval", true, code)) return code;
  pwm::check_input_file("--ckpt", ckpt_path, UINTMAX_MAX);  // never open a FIFO or a device

  const Checkpoint ckpt = load_checkpoint(ckpt_path);
  check_finite(ckpt, /*moments=*/false);  // a NaN parameter would print a NaN loss
  const ParamLayout layout(ckpt.config, 0, 1);
  const std::vector<float> params = params_from_checkpoint(ckpt, layout);
  const EvalResult r = evaluate_bytes(layout, params.data(), read_file(text_path), batch, max_windows);
  std::printf("checkpoint %s: step %lld, %s\n", ckpt_path.c_str(),
              static_cast<long long>(ckpt.step), ckpt.config.to_string().c_str());
  std::printf("text %s: %lld windows, %lld tokens predicted\n", text_path.c_str(),
              static_cast<long long>(r.windows), static_cast<long long>(r.tokens));
  if (precise) {
    std::printf("xent %.17g nats/token = %.17g bits/byte (uniform: %.17g nats); loss with z-loss %.17g\n", r.xent,
                r.xent / std::log(2.0), std::log(static_cast<double>(ckpt.config.vocab)), r.loss);
  } else {
    std::printf("xent %.4f nats/token = %.4f bits/byte (uniform: %.4f nats); loss with z-loss %.4f\n", r.xent,
                r.xent / std::log(2.0), std::log(static_cast<double>(ckpt.config.vocab)), r.loss);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return pwm::run_tool_main("pwm_eval", argc, argv, run); }
