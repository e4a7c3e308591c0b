#include "common/check.h"

#include "common/env.h"

#include <cstdio>
#include <new>

namespace pwm::detail {

void throw_check(const char* file, int line, const std::string& msg) {
  // Keep only the path below the project root so messages stay short.
  std::string f = file;
  for (const char* root : {"/common/", "/collectives/", "/model/", "/spmd/", "/pathways/",
                           "/tests/", "/bench/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos) {
      f = f.substr(pos + 1);
      break;
    }
  }
  throw Error(fmt::format("{}:{}: {}", f, line, msg));
}

}  // namespace pwm::detail

namespace pwm {

std::string error_line(const std::exception& e) {
  if (dynamic_cast<const Error*>(&e) != nullptr) return e.what();
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr)
    return "out of memory: this process could not allocate what the run needs; use a smaller model, batch or data, "
           "fewer ranks per host, or more hosts";
  return fmt::format("internal error: {} (a bug, not your input: please report it with the command line)", e.what());
}

int run_tool_main(const char* tool, int argc, char** argv, int (*body)(int, char**)) {
  if (const std::string bad = check_environment(); !bad.empty()) {
    std::fprintf(stderr, "%s: error: %s\n", tool, bad.c_str());
    return 1;
  }
  try {
    return body(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, error_line(e).c_str());
    return 1;
  }
}

}  // namespace pwm
