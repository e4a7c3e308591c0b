// Command lines parsed the same strict way in every program, with errors in the project's words.
//
// CLI11 converts numbers leniently: an int64 flag given 99999999999999999999 saturates to
// INT64_MAX, an unsigned one given -1 wraps to 2^64-1, "010" reads as octal 8 and a double flag
// takes "inf" or "nan". parse_command_line() first adds one strict check to every option by its
// type: a whole number is decimal digits with an optional sign and fits in 64 bits (no sign for
// unsigned); a real number is finite and in a double's range; the whole text is the number (no
// trailing junk). Ranges per flag are the program's own validation.
//
// Every CLI11 error becomes one line naming the flag and what it expects, e.g.
//   --steps 5x: expected a whole number (decimal digits), e.g. --steps 100
//   --bogus is not a flag of spmd_train
//   --lr needs a value
// and ends with "(see PROGRAM --help)". Nothing here touches MPI: every rank parses alone.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace pwm {

// Adds the strict number checks to every option of `app` that holds a number (call once, after
// the options are added; parse_command_line() does).
void harden_numbers(CLI::App& app);

// The one line for a CLI11 error (not --help) thrown while parsing `app` named `program`.
std::string parse_error_line(const CLI::App& app, const CLI::Error& e, const std::string& program);

// harden_numbers + parse. Returns true to run; false after --help (printed when print_help,
// exit_code set to CLI11's code). Throws pwm::Error with parse_error_line() on a bad command line.
bool parse_command_line(CLI::App& app, int argc, char** argv, const std::string& program, bool print_help,
                        int& exit_code);
// The same for arguments given as a vector in CLI11's reverse order (a config file's flags).
// Throws pwm::Error("<context>: <line>") on a bad value.
void parse_arguments(CLI::App& app, std::vector<std::string> reversed_args, const std::string& context);

}  // namespace pwm
