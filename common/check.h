// Error handling shared by every library (docs/errors.md).
//
// Two tiers, as in gloo:
//  - PWM_CHECK*: a broken invariant or a bad argument. Throws pwm::Error whose message carries
//    file:line, the failed condition and, for the comparison forms, both values.
//  - pwm::Error thrown directly (PWM_THROW) for conditions a caller may handle: bad input,
//    I/O failure, a peer gone. Executables catch it in main, print one line, exit non-zero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace pwm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
[[noreturn]] void throw_check(const char* file, int line, const std::string& msg);
}  // namespace detail

// The one line a program prints for an exception that ends it: a pwm::Error's own message (the
// project's words); for the C++ library's std::bad_alloc, what ran out and what to do; for any
// other exception (a library's or the standard library's, which no bad input should reach), its
// text marked as an internal error to report.
std::string error_line(const std::exception& e);

// The main() of a single-process tool: returns body(argc, argv), or prints "<tool>: error: <what>"
// on stderr and returns 1 when it throws. (MPI programs use collectives::run_mpi_main.)
int run_tool_main(const char* tool, int argc, char** argv, int (*body)(int, char**));

}  // namespace pwm

// PWM_THROW("bad --mesh {}: ...", value): throws pwm::Error with the formatted message.
#define PWM_THROW(...) throw ::pwm::Error(::fmt::format(__VA_ARGS__))

// PWM_CHECK(cond, "fmt", args...): message optional.
#define PWM_CHECK(cond, ...)                                                               \
  do {                                                                                     \
    if (!(cond)) [[unlikely]]                                                              \
      ::pwm::detail::throw_check(__FILE__, __LINE__,                                       \
                                 "check failed: " #cond __VA_OPT__(": " + ::fmt::format(__VA_ARGS__))); \
  } while (0)

#define PWM_CHECK_OP_(a, b, op)                                                            \
  do {                                                                                     \
    const auto& pwm_a_ = (a);                                                              \
    const auto& pwm_b_ = (b);                                                              \
    if (!(pwm_a_ op pwm_b_)) [[unlikely]]                                                  \
      ::pwm::detail::throw_check(                                                          \
          __FILE__, __LINE__,                                                              \
          ::fmt::format("check failed: {} {} {} ({} vs {})", #a, #op, #b, pwm_a_, pwm_b_)); \
  } while (0)

#define PWM_CHECK_EQ(a, b) PWM_CHECK_OP_(a, b, ==)
#define PWM_CHECK_NE(a, b) PWM_CHECK_OP_(a, b, !=)
#define PWM_CHECK_LT(a, b) PWM_CHECK_OP_(a, b, <)
#define PWM_CHECK_LE(a, b) PWM_CHECK_OP_(a, b, <=)
#define PWM_CHECK_GT(a, b) PWM_CHECK_OP_(a, b, >)
#define PWM_CHECK_GE(a, b) PWM_CHECK_OP_(a, b, >=)
