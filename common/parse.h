// Numbers read from text strictly, for every parser of flags, lists and settings: the whole text
// is the number (no trailing junk), a whole number is decimal and fits in 64 bits, a real number
// is finite and in a double's range. The checkers return "" or what is wrong ("'5x' is not a
// whole number (decimal digits, e.g. 100)"); the parsers throw pwm::Error("<what> <that>").
#pragma once

#include <cstdint>
#include <string>

namespace pwm {

std::string check_whole_number(const std::string& text, bool negative_ok = true);
std::string check_real_number(const std::string& text);

// A whole number in [lo, hi]; `what` names it in the error ("--islands 2x: ...").
int64_t parse_whole(const std::string& what, const std::string& text, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);
double parse_real(const std::string& what, const std::string& text);

}  // namespace pwm
