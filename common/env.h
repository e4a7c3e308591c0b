// The programs' environment settings (PWM_*), parsed in one place.
//
// Every PWM_* variable a program reads is registered in env.cc's table with what it accepts (a
// number in a range, an integer in a range, 0 or 1, or a text of a given form) and an example.
// The getters parse a registered variable against its entry; check_environment() checks every
// registered variable that is set, so that a program refuses a bad value before it does
// anything else (collectives::MpiEnvironment does so on every rank, and run_tool_main), with one
// line such as
//   PWM_COLL_TIMEOUT=abc: expected a number of seconds > 0 (the collectives' watchdog timeout);
//   unset it for the default, or set e.g. PWM_COLL_TIMEOUT=300
// Reading a name that is not registered is a bug (PWM_CHECK). Thread-safe (reads only).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pwm {

// The value of NAME, or `fallback` when it is unset or empty. A value outside the registered
// range throws pwm::Error with the line above. (A flag reads as 0 or 1.)
double env_double(const char* name, double fallback);
int64_t env_int(const char* name, int64_t fallback);
// A text setting: its value ("" when unset), checked against its registered form.
std::string env_string(const char* name);

// Every registered setting that is set, checked: the first bad one as one line ("" = all good).
std::string check_environment();

// The registered settings that are set, as (name, value) in the table's order: what the
// trainers add to the configuration every rank must share (train/config.h canonical_json).
std::vector<std::pair<std::string, std::string>> settings_in_effect();
// Two ranks' settings, each as "NAME=VALUE\n" lines in the table's order: the first few names
// whose values differ, as "PWM_X=a vs (unset), ..." (A first).
std::string describe_settings_difference(const std::string& a, const std::string& b);

}  // namespace pwm
