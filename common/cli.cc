#include "common/cli.h"

#include <fmt/format.h>


#include "common/check.h"
#include "common/parse.h"

namespace pwm {

namespace {

enum class NumberKind { kNone, kSigned, kUnsigned, kReal };

NumberKind kind_of(const CLI::Option* o) {
  std::string t = o->get_type_name();  // "INT", "UINT", "FLOAT", ..., then ":" and its checks
  t = t.substr(0, t.find(':'));
  if (t == "INT") return NumberKind::kSigned;
  if (t == "UINT") return NumberKind::kUnsigned;
  if (t == "FLOAT") return NumberKind::kReal;
  return NumberKind::kNone;
}

void harden(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const NumberKind k = kind_of(o);
    if (k == NumberKind::kNone) continue;
    o->check(CLI::Validator(
        [k](std::string& s) { return k == NumberKind::kReal ? check_real_number(s) : check_whole_number(s, k == NumberKind::kSigned); },
        "", ""));
  }
  for (CLI::App* sub : app.get_subcommands({})) harden(*sub);
}

// "--x: ..." -> "--x" (CLI11 starts most messages with the option's name).
std::string leading_name(const std::string& what) { return what.substr(0, what.find(':')); }

}  // namespace

void harden_numbers(CLI::App& app) { harden(app); }

std::string parse_error_line(const CLI::App& app, const CLI::Error& e, const std::string& program) {
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    const std::vector<std::string> extra = app.remaining();
    if (extra.empty()) return fmt::format("unexpected arguments for {}", program);
    const std::string& x = extra.front();
    if (!x.empty() && x[0] == '-') return fmt::format("{} is not a flag of {}", x.substr(0, x.find('=')), program);
    return fmt::format("unexpected argument '{}' (a flag's value goes right after it; a flag that is a switch takes "
                       "none)",
                       x);
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    if (what.find("missing") != std::string::npos) return fmt::format("{} needs a value", leading_name(what));
    return fmt::format("{} takes no value or a different number of values", leading_name(what));
  }
  if (dynamic_cast<const CLI::ValidationError*>(&e) != nullptr) {
    // CLI11's IsMember: "--x: value not in {a,b,c}"; the number checks above are already ours.
    const size_t in = what.find(" not in {");
    if (in != std::string::npos && what.back() == '}') {
      const std::string name = leading_name(what);
      const std::string value = what.substr(name.size() + 2, in - name.size() - 2);
      std::string names = what.substr(in + 9, what.size() - in - 10);
      for (size_t c = names.find(','); c != std::string::npos; c = names.find(',', c + 2)) names.insert(c + 1, " ");
      return fmt::format("{} '{}': expected one of {}", name, value, names);
    }
    return what;
  }
  if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    // "Could not convert: --x = v" or "The value v is not an allowed value for --x".
    const size_t eq = what.find(" = ");
    if (what.rfind("Could not convert: ", 0) == 0 && eq != std::string::npos)
      return fmt::format("{} '{}': not a value it accepts", what.substr(19, eq - 19), what.substr(eq + 3));
    const size_t for_at = what.rfind(" for ");
    if (for_at != std::string::npos) return fmt::format("{}: not a value it accepts", what.substr(for_at + 5));
  }
  return what;  // RequiredError and the rest already name the option in plain words
}

bool parse_command_line(CLI::App& app, int argc, char** argv, const std::string& program, bool print_help,
                        int& exit_code) {
  harden(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    exit_code = print_help ? app.exit(e) : 0;
    return false;
  } catch (const CLI::CallForAllHelp& e) {
    exit_code = print_help ? app.exit(e) : 0;
    return false;
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("{} (see {} --help)", parse_error_line(app, e, program), program));
  }
  return true;
}

void parse_arguments(CLI::App& app, std::vector<std::string> reversed_args, const std::string& context) {
  harden(app);
  try {
    app.parse(reversed_args);
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("{}: {}", context, parse_error_line(app, e, app.get_name())));
  }
}

}  // namespace pwm
