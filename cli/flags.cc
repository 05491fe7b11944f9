#include "cli/flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace moeserve::cli {

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::String(const char* name, std::string* out, const char* help) {
  flags_.push_back({name, Type::kString, out, help, out->empty() ? "" : *out});
}
void FlagSet::Int(const char* name, int64_t* out, const char* help) {
  flags_.push_back({name, Type::kInt, out, help, std::to_string(*out)});
}
void FlagSet::Double(const char* name, double* out, const char* help) {
  flags_.push_back({name, Type::kDouble, out, help, fmt::format("{}", *out)});
}
void FlagSet::Bool(const char* name, bool* out, const char* help) {
  flags_.push_back({name, Type::kBool, out, help, ""});
}

const FlagSet::Flag* FlagSet::Find(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::WasSet(const std::string& name) const {
  return std::find(set_.begin(), set_.end(), name) != set_.end();
}

Status FlagSet::Set(const Flag& flag, const std::string& value) {
  switch (flag.type) {
    case Type::kString:
      *static_cast<std::string*>(flag.out) = value;
      break;
    case Type::kInt: {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno == ERANGE) {
        return InvalidArgument("--{}: '{}' is not an integer", flag.name, value);
      }
      *static_cast<int64_t*>(flag.out) = v;
      break;
    }
    case Type::kDouble: {
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
        return InvalidArgument("--{}: '{}' is not a number", flag.name, value);
      }
      *static_cast<double*>(flag.out) = v;
      break;
    }
    case Type::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(flag.out) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(flag.out) = false;
      } else {
        return InvalidArgument("--{}: '{}' is not true or false", flag.name, value);
      }
      break;
  }
  set_.push_back(flag.name);
  return OkStatus();
}

Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return OkStatus();
    }
    if (!arg.starts_with("--") || arg.size() == 2) {
      return InvalidArgument("unexpected argument '{}' (flags start with --; see --help)", arg);
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const Flag* flag = Find(name);
    if (flag == nullptr) return InvalidArgument("unknown flag --{} (see --help)", name);
    if (eq != std::string::npos) {
      RETURN_IF_ERROR(Set(*flag, arg.substr(eq + 1)));
    } else if (flag->type == Type::kBool) {
      RETURN_IF_ERROR(Set(*flag, "true"));
    } else {
      if (i + 1 >= args.size()) return InvalidArgument("flag --{} needs a value", name);
      RETURN_IF_ERROR(Set(*flag, args[++i]));
    }
  }
  return OkStatus();
}

std::vector<FlagSet::Doc> FlagSet::Docs() const {
  std::vector<Doc> docs;
  for (const Flag& f : flags_) {
    const char* value = f.type == Type::kBool     ? ""
                        : f.type == Type::kString ? "TEXT"
                        : f.type == Type::kInt    ? "N"
                                                  : "X";
    docs.push_back({f.name, value, f.help, f.default_text});
  }
  return docs;
}

std::string FlagSet::Help() const {
  std::string out = fmt::format("usage: {} [flags]\n\n{}\n\nflags:\n", command_, summary_);
  for (const Doc& f : Docs()) {
    std::string left = fmt::format("  --{}{}{}", f.name, f.value.empty() ? "" : " ", f.value);
    std::string line = fmt::format("{:<28} {}", left, f.help);
    if (!f.default_text.empty()) line += fmt::format(" (default: {})", f.default_text);
    out += line + "\n";
  }
  out += fmt::format("  {:<26} {}\n", "--help", "print this help");
  return out;
}

}  // namespace moeserve::cli
