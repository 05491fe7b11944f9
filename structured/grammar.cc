#include "structured/grammar.h"

#include <algorithm>
#include <utility>

namespace moeserve::structured {

Expr Empty() { return Expr{}; }

Expr Lit(std::string bytes) {
  if (bytes.empty()) return Empty();
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.bytes = std::move(bytes);
  return e;
}

Expr Chars(std::vector<CodeRange> ranges) {
  Expr e;
  e.kind = Expr::Kind::kChars;
  e.ranges = NormalizeRanges(std::move(ranges));
  return e;
}

Expr Char(uint32_t cp) { return Chars({{cp, cp}}); }

Expr ByteSet(std::vector<CodeRange> ranges) {
  for (CodeRange& r : ranges) r.hi = std::min<uint32_t>(r.hi, 255);
  std::erase_if(ranges, [](const CodeRange& r) { return r.lo > r.hi; });
  std::sort(ranges.begin(), ranges.end(),
            [](const CodeRange& a, const CodeRange& b) { return a.lo < b.lo; });
  std::vector<CodeRange> merged;
  for (const CodeRange& r : ranges) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  Expr e;
  e.kind = Expr::Kind::kByteSet;
  e.ranges = std::move(merged);
  return e;
}

Expr Ref(int rule) {
  Expr e;
  e.kind = Expr::Kind::kRule;
  e.rule = rule;
  return e;
}

Expr Seq(std::vector<Expr> children) {
  std::erase_if(children, [](const Expr& c) { return c.kind == Expr::Kind::kEmpty; });
  if (children.empty()) return Empty();
  if (children.size() == 1) return std::move(children[0]);
  Expr e;
  e.kind = Expr::Kind::kSeq;
  e.children = std::move(children);
  return e;
}

Expr Alt(std::vector<Expr> children) {
  if (children.size() == 1) return std::move(children[0]);
  Expr e;
  e.kind = Expr::Kind::kAlt;
  e.children = std::move(children);
  return e;
}

Expr Repeat(Expr child, int min, int max) {
  if (min == 1 && max == 1) return child;
  if (max == 0) return Empty();
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.children.push_back(std::move(child));
  e.min = min;
  e.max = max;
  return e;
}

std::vector<CodeRange> NormalizeRanges(std::vector<CodeRange> ranges) {
  std::vector<CodeRange> in;
  for (CodeRange r : ranges) {
    r.hi = std::min(r.hi, kMaxCodePoint);
    if (r.lo > r.hi) continue;
    // Cut out the surrogates, which UTF-8 cannot carry.
    if (r.lo < 0xD800 && r.hi >= 0xD800) {
      in.push_back({r.lo, 0xD7FF});
      if (r.hi > 0xDFFF) in.push_back({0xE000, r.hi});
    } else if (r.lo >= 0xD800 && r.lo <= 0xDFFF) {
      if (r.hi > 0xDFFF) in.push_back({0xE000, r.hi});
    } else {
      in.push_back(r);
    }
  }
  std::sort(in.begin(), in.end(),
            [](const CodeRange& a, const CodeRange& b) { return a.lo < b.lo; });
  std::vector<CodeRange> out;
  for (const CodeRange& r : in) {
    if (!out.empty() &&
        (r.lo <= out.back().hi + 1 || (out.back().hi == 0xD7FF && r.lo == 0xE000))) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<CodeRange> ComplementRanges(const std::vector<CodeRange>& ranges) {
  std::vector<CodeRange> norm = NormalizeRanges(ranges);
  std::vector<CodeRange> out;
  uint32_t next = 0;
  for (const CodeRange& r : norm) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return NormalizeRanges(std::move(out));
}

std::vector<CodeRange> IntersectRanges(const std::vector<CodeRange>& a,
                                       const std::vector<CodeRange>& b) {
  std::vector<CodeRange> out;
  for (const CodeRange& x : a) {
    for (const CodeRange& y : b) {
      uint32_t lo = std::max(x.lo, y.lo), hi = std::min(x.hi, y.hi);
      if (lo <= hi) out.push_back({lo, hi});
    }
  }
  return NormalizeRanges(std::move(out));
}

std::string EncodeUtf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

int64_t DecodeUtf8(std::string_view text, size_t* i) {
  const size_t n = text.size(), p = *i;
  if (p >= n) return -1;
  const uint8_t b0 = static_cast<uint8_t>(text[p]);
  int len;
  uint32_t cp, min;
  if (b0 < 0x80) {
    *i = p + 1;
    return b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return -1;
  }
  if (p + len > n) return -1;
  for (int k = 1; k < len; ++k) {
    const uint8_t b = static_cast<uint8_t>(text[p + k]);
    if ((b & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  *i = p + len;
  return cp;
}

int Grammar::AddRule(std::string name) {
  names.push_back(std::move(name));
  bodies.emplace_back();
  return static_cast<int>(names.size()) - 1;
}

int Grammar::Find(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<int>(i);
  }
  return -1;
}

size_t CountNodes(const Expr& e) {
  size_t n = 1;
  for (const Expr& c : e.children) n += CountNodes(c);
  return n;
}

namespace {

Status CheckExpr(const Grammar& g, const Expr& e, const Limits& limits, size_t& nodes) {
  if (++nodes > limits.max_expr_nodes) {
    return InvalidArgument("grammar too large: more than {} nodes (max_expr_nodes)",
                           limits.max_expr_nodes);
  }
  if (e.kind == Expr::Kind::kRule && (e.rule < 0 || e.rule >= static_cast<int>(g.bodies.size()))) {
    return Internal("grammar: reference to rule {} of {}", e.rule, g.bodies.size());
  }
  if (e.kind == Expr::Kind::kRepeat) {
    if (e.min < 0 || e.min > limits.max_repeat || e.max > limits.max_repeat ||
        (e.max != Expr::kUnbounded && e.max < e.min)) {
      return InvalidArgument("repetition {{{},{}}} out of bounds (0..{}, max_repeat)", e.min, e.max,
                             limits.max_repeat);
    }
  }
  for (const Expr& c : e.children) RETURN_IF_ERROR(CheckExpr(g, c, limits, nodes));
  return OkStatus();
}

}  // namespace

Status CheckGrammar(const Grammar& g, const Limits& limits) {
  if (g.bodies.size() > limits.max_rules) {
    return InvalidArgument("grammar has {} rules, more than {} (max_rules)", g.bodies.size(),
                           limits.max_rules);
  }
  if (g.root < 0 || g.root >= static_cast<int>(g.bodies.size())) {
    return InvalidArgument("grammar has no root rule");
  }
  size_t nodes = 0;
  for (const Expr& body : g.bodies) RETURN_IF_ERROR(CheckExpr(g, body, limits, nodes));
  return OkStatus();
}

}  // namespace moeserve::structured
