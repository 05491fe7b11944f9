#include "jinja/operators.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>

#include "jinja/py_string.h"

namespace moeserve::jinja {
namespace {

std::string_view OpSymbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "+";
    case BinaryOp::kSub:
      return "-";
    case BinaryOp::kMul:
      return "*";
    case BinaryOp::kDiv:
      return "/";
    case BinaryOp::kFloorDiv:
      return "//";
    case BinaryOp::kMod:
      return "%";
    case BinaryOp::kPow:
      return "**";
    case BinaryOp::kConcat:
      return "~";
    case BinaryOp::kAnd:
      return "and";
    case BinaryOp::kOr:
      return "or";
  }
  return "?";
}

Status Unsupported(BinaryOp op, const Value& a, const Value& b) {
  return InvalidArgument("unsupported operand type(s) for {}: '{}' and '{}'", OpSymbol(op),
                         TypeName(a), TypeName(b));
}

Status Overflow() {
  return InvalidArgument("integer overflow: the result does not fit in 64 bits");
}

Status TooLarge() { return InvalidArgument("result larger than {} bytes", kMaxStringBytes); }

// Python's float divmod (Objects/floatobject.c), for // and % on floats.
void FloatDivMod(double vx, double wx, double* floordiv, double* mod) {
  *mod = std::fmod(vx, wx);
  double div = (vx - *mod) / wx;
  if (*mod != 0) {
    if ((wx < 0) != (*mod < 0)) {
      *mod += wx;
      div -= 1.0;
    }
  } else {
    *mod = std::copysign(0.0, wx);
  }
  if (div != 0) {
    *floordiv = std::floor(div);
    if (div - *floordiv > 0.5) *floordiv += 1.0;
  } else {
    *floordiv = std::copysign(0.0, vx / wx);
  }
}

Result<Value> IntPow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 0) return InvalidArgument("0.0 cannot be raised to a negative power");
    return Value::Float(std::pow(static_cast<double>(base), static_cast<double>(exp)));
  }
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, base, &result)) return Overflow();
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
  }
  return Value::Int(result);
}

Result<Value> Repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.AsString();
    if (!s.empty() && static_cast<uint64_t>(n) > kMaxStringBytes / s.size()) return TooLarge();
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value::String(std::move(out), seq.is_markup());
  }
  const List& list = seq.AsList();
  if (!list.items.empty() && static_cast<uint64_t>(n) > kMaxStringBytes / list.items.size()) {
    return TooLarge();
  }
  std::vector<Value> items;
  items.reserve(list.items.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) items.insert(items.end(), list.items.begin(), list.items.end());
  return Value::MakeList(std::move(items), list.kind);
}

bool IsSequence(const Value& v) {
  return v.is_list() && (v.AsList().kind == ListKind::kList || v.AsList().kind == ListKind::kTuple);
}

// One conversion of a %-format: %[(key)][flags][width][.precision][length]type.
struct Spec {
  bool left = false, zero = false, plus = false, space = false, alt = false;
  int width = -1, precision = -1;
  char type = 's';
};

std::string Pad(std::string body, const Spec& spec, bool numeric) {
  if (spec.width < 0 || static_cast<int>(CodePointCount(body)) >= spec.width) return body;
  const size_t fill = static_cast<size_t>(spec.width) - static_cast<size_t>(CodePointCount(body));
  if (spec.left) return body + std::string(fill, ' ');
  if (spec.zero && numeric) {
    size_t sign = 0;
    if (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) sign = 1;
    if (body.size() >= sign + 2 && body[sign] == '0' &&
        (body[sign + 1] == 'x' || body[sign + 1] == 'X' || body[sign + 1] == 'o')) {
      sign += 2;
    }
    return body.substr(0, sign) + std::string(fill, '0') + body.substr(sign);
  }
  return std::string(fill, ' ') + body;
}

Result<std::string> FormatOne(const Spec& spec, const Value& v, bool escape) {
  if (v.is_undefined() && spec.type != 's' && spec.type != 'r' && spec.type != 'a') {
    return UndefinedError(v);
  }
  switch (spec.type) {
    case 's':
    case 'r':
    case 'a': {
      std::string s = spec.type == 's' ? ToStr(v) : Repr(v);
      if (escape && !v.is_markup()) s = HtmlEscape(s);
      if (spec.precision >= 0 && CodePointCount(s) > spec.precision) {
        s.resize(ByteOffsetOfCodePoint(s, spec.precision));
      }
      return Pad(std::move(s), spec, false);
    }
    case 'd':
    case 'i':
    case 'u':
    case 'o':
    case 'x':
    case 'X': {
      int64_t n;
      if (v.is_integral()) {
        n = v.AsInt();
      } else if (v.is_float() && (spec.type == 'd' || spec.type == 'i' || spec.type == 'u')) {
        const double d = v.AsDouble();
        if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) {
          return InvalidArgument("cannot convert float {} to integer", FormatPyFloat(d));
        }
        n = static_cast<int64_t>(d);
      } else {
        return InvalidArgument("%{} format: {} is required, not {}", spec.type,
                               spec.type == 'd' || spec.type == 'i' || spec.type == 'u'
                                   ? "a real number"
                                   : "an integer",
                               TypeName(v));
      }
      const bool negative = n < 0;
      const uint64_t mag = negative ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
      std::string digits;
      switch (spec.type) {
        case 'o':
          digits = fmt::format("{:o}", mag);
          break;
        case 'x':
          digits = fmt::format("{:x}", mag);
          break;
        case 'X':
          digits = fmt::format("{:X}", mag);
          break;
        default:
          digits = std::to_string(mag);
      }
      if (spec.precision >= 0 && static_cast<int>(digits.size()) < spec.precision) {
        digits.insert(0, static_cast<size_t>(spec.precision) - digits.size(), '0');
      }
      std::string prefix = negative ? "-" : spec.plus ? "+" : spec.space ? " " : "";
      if (spec.alt && spec.type == 'o') prefix += "0o";
      if (spec.alt && spec.type == 'x') prefix += "0x";
      if (spec.alt && spec.type == 'X') prefix += "0X";
      return Pad(prefix + digits, spec, true);
    }
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G': {
      if (!v.is_number()) {
        return InvalidArgument("must be real number, not {}", TypeName(v));
      }
      const double d = v.AsDouble();
      if (!std::isfinite(d)) {
        std::string body = std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
        if (spec.type == 'E' || spec.type == 'F' || spec.type == 'G') body = PyUpper(body);
        if (d > 0 || std::isnan(d)) body = (spec.plus ? "+" : spec.space ? " " : "") + body;
        Spec no_zero = spec;
        no_zero.zero = false;
        return Pad(body, no_zero, false);
      }
      std::string cfmt = "%";
      if (spec.plus) cfmt += '+';
      if (spec.space) cfmt += ' ';
      if (spec.alt) cfmt += '#';
      cfmt += fmt::format(".{}", spec.precision < 0 ? 6 : std::min(spec.precision, 400));
      cfmt += spec.type;
      char buf[512];
      std::snprintf(buf, sizeof(buf), cfmt.c_str(), d);
      return Pad(buf, spec, true);
    }
    case 'c': {
      if (v.is_string()) {
        if (CodePointCount(v.AsString()) != 1) {
          return InvalidArgument("%c requires an int or a unicode character");
        }
        return Pad(v.AsString(), spec, false);
      }
      if (!v.is_integral() || v.AsInt() < 0 || v.AsInt() > 0x10FFFF) {
        return InvalidArgument("%c requires an int in range(0x110000) or a character");
      }
      std::string s;
      AppendUtf8(static_cast<char32_t>(v.AsInt()), &s);
      return Pad(std::move(s), spec, false);
    }
    default:
      return InvalidArgument("unsupported format character '{}'", spec.type);
  }
}

}  // namespace

Status UndefinedError(const Value& undefined) {
  const std::string& message = undefined.UndefinedMessage();
  return InvalidArgument("{}", message.empty() ? "undefined value used in an operation" : message);
}

Result<Value> UnaryOperation(UnaryOp op, const Value& v) {
  if (op == UnaryOp::kNot) return Value::Bool(!Truthy(v));
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) {
    if (op == UnaryOp::kPos) return Value::Int(v.AsInt());
    if (v.AsInt() == INT64_MIN) return Overflow();
    return Value::Int(-v.AsInt());
  }
  if (v.is_float()) return Value::Float(op == UnaryOp::kPos ? v.AsDouble() : -v.AsDouble());
  return InvalidArgument("bad operand type for unary {}: '{}'", op == UnaryOp::kNeg ? "-" : "+",
                         TypeName(v));
}

Result<Value> BinaryOperation(BinaryOp op, const Value& a, const Value& b) {
  if (op == BinaryOp::kConcat) {
    RETURN_IF_ERROR(CheckPrintable(a));
    RETURN_IF_ERROR(CheckPrintable(b));
    std::string s = ToStr(a);
    const std::string rhs = ToStr(b);
    if (s.size() + rhs.size() > kMaxStringBytes) return TooLarge();
    s += rhs;
    return Value::String(std::move(s));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);

  if (a.is_number() && b.is_number()) {
    const bool ints = a.is_integral() && b.is_integral();
    if (ints) {
      const int64_t x = a.AsInt(), y = b.AsInt();
      int64_t r;
      switch (op) {
        case BinaryOp::kAdd:
          if (__builtin_add_overflow(x, y, &r)) return Overflow();
          return Value::Int(r);
        case BinaryOp::kSub:
          if (__builtin_sub_overflow(x, y, &r)) return Overflow();
          return Value::Int(r);
        case BinaryOp::kMul:
          if (__builtin_mul_overflow(x, y, &r)) return Overflow();
          return Value::Int(r);
        case BinaryOp::kDiv:
          if (y == 0) return InvalidArgument("division by zero");
          return Value::Float(static_cast<double>(x) / static_cast<double>(y));
        case BinaryOp::kFloorDiv:
        case BinaryOp::kMod: {
          if (y == 0) return InvalidArgument("integer division or modulo by zero");
          if (x == INT64_MIN && y == -1) {
            if (op == BinaryOp::kMod) return Value::Int(0);
            return Overflow();
          }
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            m += y;
            --q;
          }
          return Value::Int(op == BinaryOp::kFloorDiv ? q : m);
        }
        case BinaryOp::kPow:
          return IntPow(x, y);
        default:
          break;
      }
    } else {
      const double x = a.AsDouble(), y = b.AsDouble();
      switch (op) {
        case BinaryOp::kAdd:
          return Value::Float(x + y);
        case BinaryOp::kSub:
          return Value::Float(x - y);
        case BinaryOp::kMul:
          return Value::Float(x * y);
        case BinaryOp::kDiv:
          if (y == 0) return InvalidArgument("float division by zero");
          return Value::Float(x / y);
        case BinaryOp::kFloorDiv:
        case BinaryOp::kMod: {
          if (y == 0) {
            return InvalidArgument(
                "{}", op == BinaryOp::kMod ? "float modulo" : "float floor division by zero");
          }
          double q, m;
          FloatDivMod(x, y, &q, &m);
          return Value::Float(op == BinaryOp::kFloorDiv ? q : m);
        }
        case BinaryOp::kPow: {
          if (x == 0 && y < 0) return InvalidArgument("0.0 cannot be raised to a negative power");
          if (x < 0 && y != std::floor(y)) {
            return InvalidArgument(
                "negative number raised to a fractional power: complex "
                "results are not supported");
          }
          const double r = std::pow(x, y);
          if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) {
            return InvalidArgument("(34, 'Numerical result out of range')");
          }
          return Value::Float(r);
        }
        default:
          break;
      }
    }
    return Unsupported(op, a, b);
  }

  switch (op) {
    case BinaryOp::kAdd:
      if (a.is_string() && b.is_string()) {
        if (a.AsString().size() + b.AsString().size() > kMaxStringBytes) return TooLarge();
        // markupsafe: Markup + str escapes the str, and so does str + Markup (Markup's __radd__).
        if (a.is_markup() || b.is_markup()) {
          const std::string lhs = a.is_markup() ? a.AsString() : HtmlEscape(a.AsString());
          const std::string rhs = b.is_markup() ? b.AsString() : HtmlEscape(b.AsString());
          return Value::String(lhs + rhs, true);
        }
        return Value::String(a.AsString() + b.AsString());
      }
      if (IsSequence(a) && IsSequence(b) && a.AsList().kind == b.AsList().kind) {
        if (a.AsList().items.size() + b.AsList().items.size() > kMaxStringBytes) return TooLarge();
        std::vector<Value> items = a.AsList().items;
        items.insert(items.end(), b.AsList().items.begin(), b.AsList().items.end());
        return Value::MakeList(std::move(items), a.AsList().kind);
      }
      break;
    case BinaryOp::kMul:
      if ((a.is_string() || IsSequence(a)) && b.is_integral()) return Repeat(a, b.AsInt());
      if (a.is_integral() && (b.is_string() || IsSequence(b))) return Repeat(b, a.AsInt());
      break;
    case BinaryOp::kMod:
      if (a.is_string()) {
        ASSIGN_OR_RETURN(std::string s, PercentFormat(a.AsString(), b, a.is_markup()));
        return Value::String(std::move(s), a.is_markup());
      }
      break;
    default:
      break;
  }
  return Unsupported(op, a, b);
}

Result<bool> CompareOperation(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kEq:
      return Equals(a, b);
    case CompareOp::kNe:
      return !Equals(a, b);
    case CompareOp::kIn:
      return Contains(b, a);
    case CompareOp::kNotIn: {
      ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return !in;
    }
    default:
      break;
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const char* symbol = op == CompareOp::kLt   ? "<"
                       : op == CompareOp::kLe ? "<="
                       : op == CompareOp::kGt ? ">"
                                              : ">=";
  // NaN compares false with everything, as in Python.
  if ((a.is_float() && std::isnan(a.AsDouble()) && b.is_number()) ||
      (b.is_float() && std::isnan(b.AsDouble()) && a.is_number())) {
    return false;
  }
  ASSIGN_OR_RETURN(int c, Compare(a, b, symbol));
  switch (op) {
    case CompareOp::kLt:
      return c < 0;
    case CompareOp::kLe:
      return c <= 0;
    case CompareOp::kGt:
      return c > 0;
    default:
      return c >= 0;
  }
}

Result<std::string> PercentFormat(std::string_view format, const Value& args, bool escape) {
  std::vector<Value> positional;
  const Dict* mapping = nullptr;
  if (args.is_list() && args.AsList().kind == ListKind::kTuple) {
    positional = args.AsList().items;
  } else {
    positional.push_back(args);
    if (args.is_dict()) mapping = &args.AsDict();
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) return InvalidArgument("incomplete format");
    if (format[i] == '%') {
      out.push_back('%');
      continue;
    }
    const Value* value = nullptr;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string_view::npos) return InvalidArgument("incomplete format key");
      if (mapping == nullptr) return InvalidArgument("format requires a mapping");
      const std::string_view key = format.substr(i + 1, close - i - 1);
      value = mapping->Find(key);
      if (value == nullptr) return InvalidArgument("KeyError: {}", PyStrRepr(key));
      used_mapping = true;
      i = close + 1;
    }
    Spec spec;
    for (; i < format.size(); ++i) {
      const char f = format[i];
      if (f == '-')
        spec.left = true;
      else if (f == '0')
        spec.zero = true;
      else if (f == '+')
        spec.plus = true;
      else if (f == ' ')
        spec.space = true;
      else if (f == '#')
        spec.alt = true;
      else
        break;
    }
    auto read_number = [&](int* target) -> Status {
      if (i < format.size() && format[i] == '*') {
        if (next >= positional.size() || !positional[next].is_integral()) {
          return InvalidArgument("* wants int");
        }
        *target = static_cast<int>(std::min<int64_t>(positional[next++].AsInt(), 1 << 20));
        ++i;
        return OkStatus();
      }
      int n = -1;
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
        n = (n < 0 ? 0 : n) * 10 + (format[i++] - '0');
        if (n > (1 << 20)) return InvalidArgument("width too big");
      }
      *target = n;
      return OkStatus();
    };
    RETURN_IF_ERROR(read_number(&spec.width));
    if (spec.width < 0 && spec.width != -1) {
      spec.left = true;
      spec.width = -spec.width;
    }
    if (i < format.size() && format[i] == '.') {
      ++i;
      RETURN_IF_ERROR(read_number(&spec.precision));
      if (spec.precision < 0) spec.precision = 0;
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) return InvalidArgument("incomplete format");
    spec.type = format[i];
    if (value == nullptr) {
      if (next >= positional.size())
        return InvalidArgument("not enough arguments for format string");
      value = &positional[next++];
    }
    ASSIGN_OR_RETURN(std::string piece, FormatOne(spec, *value, escape));
    out += piece;
    if (out.size() > kMaxStringBytes) return TooLarge();
  }
  if (!used_mapping && mapping == nullptr && next < positional.size()) {
    return InvalidArgument("not all arguments converted during string formatting");
  }
  return out;
}

Result<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kList: {
      const List& list = v.AsList();
      if (list.kind != ListKind::kIterator) return list.items;
      // An iterator yields what is left of it, once.
      std::vector<Value> rest(list.items.begin() + static_cast<ptrdiff_t>(list.position),
                              list.items.end());
      list.position = list.items.size();
      return rest;
    }
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.AsDict().size());
      for (const auto& [k, value] : v.AsDict().entries()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      const std::string& s = v.AsString();
      size_t pos = 0;
      while (pos < s.size()) {
        const size_t start = pos;
        DecodeUtf8(s, &pos);
        chars.push_back(Value::String(s.substr(start, pos - start), v.is_markup()));
      }
      return chars;
    }
    default:
      return InvalidArgument("'{}' object is not iterable", TypeName(v));
  }
}

Result<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) return UndefinedError(item);
        return InvalidArgument("'in <string>' requires string as left operand, not {}",
                               TypeName(item));
      }
      return container.AsString().find(item.AsString()) != std::string::npos;
    case Value::Kind::kList: {
      const List& list = container.AsList();
      // `in` consumes an iterator up to and including the match, as in Python.
      const size_t start = list.kind == ListKind::kIterator ? list.position : 0;
      for (size_t i = start; i < list.items.size(); ++i) {
        if (Equals(list.items[i], item)) {
          if (list.kind == ListKind::kIterator) list.position = i + 1;
          return true;
        }
      }
      if (list.kind == ListKind::kIterator) list.position = list.items.size();
      return false;
    }
    case Value::Kind::kDict:
      if (!IsHashable(item)) return InvalidArgument("unhashable type: '{}'", TypeName(item));
      return container.AsDict().Find(item) != nullptr;
    default:
      return InvalidArgument("argument of type '{}' is not iterable", TypeName(container));
  }
}

Result<int64_t> ToInteger(const Value& v) {
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) return v.AsInt();
  if (v.is_float()) {
    const double d = v.AsDouble();
    if (std::isnan(d)) return InvalidArgument("cannot convert float NaN to integer");
    if (std::isinf(d)) return InvalidArgument("cannot convert float infinity to integer");
    if (std::fabs(d) >= 9.223372036854775807e18) {
      return InvalidArgument("integer overflow: {} does not fit in 64 bits", FormatPyFloat(d));
    }
    return static_cast<int64_t>(d);
  }
  return InvalidArgument("an integer is required, not '{}'", TypeName(v));
}

}  // namespace moeserve::jinja
