// The PWM_* settings' one parser (common/env.h): every bad value is one line naming the
// variable, the value, what is expected and an example; good values parse.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/check.h"
#include "common/env.h"

namespace {

struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

TEST(Env, BadValuesAreOneLineNamingVariableValueAndRange) {
  const std::pair<const char*, const char*> bad[] = {
      {"PWM_COLL_TIMEOUT", "abc"}, {"PWM_COLL_TIMEOUT", "0"},       {"PWM_COLL_TIMEOUT", "-1"},
      {"PWM_COLL_TIMEOUT", "inf"}, {"PWM_COLL_TIMEOUT", "3s"},      {"PWM_COLL_DEBUG", "yes"},
      {"PWM_COLL_DEBUG", "2"},     {"PWM_COLL_SEGMENT_BYTES", "0"}, {"PWM_COLL_SEGMENT_BYTES", "abc"},
      {"PWM_COLL_SEGMENT_BYTES", "1.5"}, {"PWM_MODEL_THREADS", "0"}, {"PWM_PW_SCHEDULER", "share:0"},
      {"PWM_PW_SCHEDULER", "lifo"}, {"PWM_PW_ISLAND_ORDERING", "off"}, {"PWM_PW_MEMORY_CAP", "-5"},
      {"PWM_PW_BATCH_DIV", "0.5"}, {"PWM_COLL_ALPHA_US", "nan"}};
  for (auto [name, value] : bad) {
    ScopedEnv e(name, value);
    const std::string line = pwm::check_environment();
    EXPECT_EQ(line.rfind(std::string(name) + "=" + value + ": expected ", 0), 0u) << line;
    EXPECT_NE(line.find("unset it for the default, or set e.g. " + std::string(name) + "="), std::string::npos) << line;
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  }
  ScopedEnv e("PWM_COLL_TIMEOUT", "abc");
  EXPECT_THROW(pwm::env_double("PWM_COLL_TIMEOUT", 300), pwm::Error);
}

TEST(Env, GoodValuesParse) {
  EXPECT_EQ(pwm::check_environment(), "");
  EXPECT_EQ(pwm::env_double("PWM_COLL_TIMEOUT", 300), 300);
  {
    ScopedEnv a("PWM_COLL_TIMEOUT", "2.5"), b("PWM_COLL_DEBUG", "1"), c("PWM_COLL_SEGMENT_BYTES", "4096"),
        d("PWM_PW_SCHEDULER", "share:8");
    EXPECT_EQ(pwm::check_environment(), "");
    EXPECT_EQ(pwm::env_double("PWM_COLL_TIMEOUT", 300), 2.5);
    EXPECT_EQ(pwm::env_int("PWM_COLL_DEBUG", 0), 1);
    EXPECT_EQ(pwm::env_int("PWM_COLL_SEGMENT_BYTES", 1), 4096);
    EXPECT_EQ(pwm::env_string("PWM_PW_SCHEDULER"), "share:8");
  }
  ScopedEnv empty("PWM_COLL_TIMEOUT", "");  // empty = unset
  EXPECT_EQ(pwm::env_double("PWM_COLL_TIMEOUT", 300), 300);
}

TEST(Env, AnUnregisteredNameIsABug) { EXPECT_THROW(pwm::env_double("PWM_NO_SUCH_SETTING", 1), pwm::Error); }

}  // namespace
