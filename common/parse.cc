#include "common/parse.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "common/check.h"

namespace pwm {

std::string check_whole_number(const std::string& s, bool negative_ok) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) {
    if (s[i] == '-' && !negative_ok) return fmt::format("'{}' is negative; expected a whole number >= 0", s);
    ++i;
  }
  bool digits = i < s.size();
  for (size_t j = i; j < s.size(); ++j) digits = digits && s[j] >= '0' && s[j] <= '9';
  if (!digits) return fmt::format("'{}' is not a whole number (decimal digits, e.g. 100)", s);
  if (s.size() - i > 1 && s[i] == '0') return fmt::format("'{}' has a leading zero; write it in decimal without one", s);
  errno = 0;
  if (negative_ok) (void)std::strtoll(s.c_str(), nullptr, 10);
  else (void)std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE) return fmt::format("'{}' is too large for a 64-bit whole number", s);
  return "";
}

std::string check_real_number(const std::string& s) {
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(s.c_str(), &end);
  // strtod also reads hexadecimal ("0x10", "0x1p-3"): not a way anyone writes a flag's value.
  const bool hex = s.find_first_of("xX") != std::string::npos;
  if (s.empty() || hex || end != s.c_str() + s.size()) return fmt::format("'{}' is not a number (e.g. 0.5 or 3e-4)", s);
  if (!std::isfinite(d)) return fmt::format("'{}' is not a finite number", s);
  if (errno == ERANGE) return fmt::format("'{}' is outside the range of a double", s);
  return "";
}

int64_t parse_whole(const std::string& what, const std::string& text, int64_t lo, int64_t hi) {
  if (std::string e = check_whole_number(text); !e.empty()) PWM_THROW("{}: {}", what, e);
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (v < lo || v > hi) PWM_THROW("{}: {} is outside [{}, {}]", what, v, lo, hi);
  return v;
}

double parse_real(const std::string& what, const std::string& text) {
  if (std::string e = check_real_number(text); !e.empty()) PWM_THROW("{}: {}", what, e);
  return std::strtod(text.c_str(), nullptr);
}

}  // namespace pwm
