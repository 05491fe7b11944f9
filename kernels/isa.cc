// ActiveIsa asks the dispatcher itself which target it picks: a per-target function that returns
// HWY_TARGET, called through HWY_DYNAMIC_DISPATCH like every kernel.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/isa.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace moeserve::kernels::HWY_NAMESPACE {
int64_t CompiledTargetImpl() { return HWY_TARGET; }
}  // namespace moeserve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>

#include "hwy/targets.h"
#include "kernels/isa.h"

namespace moeserve::kernels {

HWY_EXPORT(CompiledTargetImpl);

namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Name(int64_t target) { return Lower(hwy::TargetName(target)); }

// Every target this build compiled, best first (Highway: a lower bit is a better target).
std::vector<int64_t> CompiledTargets() {
  std::vector<int64_t> out;
  for (int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1) out.push_back(bits & -bits);
  return out;
}

// The targets the CPU can run, whatever SelectIsa restricted since: read once, before the first
// restriction (SelectIsa calls this before it restricts).
int64_t CpuTargets() {
  static const int64_t cpu = hwy::SupportedTargets();
  return cpu;
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::vector<std::string> AvailableIsas() {
  std::vector<std::string> out;
  for (int64_t target : CompiledTargets()) {
    if ((CpuTargets() & target) != 0) out.push_back(Name(target));
  }
  return out;
}

Status SelectIsa(std::string_view name) {
  std::string wanted = Lower(name);
  if (wanted == "avx512") wanted = "avx3";
  std::vector<std::string> compiled;
  for (int64_t target : CompiledTargets()) {
    compiled.push_back(Name(target));
    if (compiled.back() != wanted) continue;
    if ((CpuTargets() & target) == 0) {
      return InvalidArgument("'{}': this CPU cannot run it (available: {})", name,
                             Join(AvailableIsas()));
    }
    hwy::DisableTargets(target - 1);  // every better target (replaces an earlier restriction)
    return OkStatus();
  }
  return InvalidArgument("'{}' is not a SIMD target of this build ({})", name, Join(compiled));
}

Status SelectIsaFromEnvironment() {
  const char* value = std::getenv("MOESERVE_ISA");
  if (value == nullptr || *value == '\0') return OkStatus();
  if (Status s = SelectIsa(value); !s.ok()) {
    return InvalidArgument("MOESERVE_ISA: {}", s.message());
  }
  return OkStatus();
}

std::string ActiveIsa() { return Name(HWY_DYNAMIC_DISPATCH(CompiledTargetImpl)()); }

}  // namespace moeserve::kernels

#endif  // HWY_ONCE
