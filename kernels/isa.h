// The SIMD instruction set the kernels run with, and the knob that restricts it (--isa,
// MOESERVE_ISA): Highway compiles every kernel for several x86 targets and dispatches to the best
// one the CPU has; restricting the dispatch lets an AVX-512 machine measure and tune the AVX2
// path that many users' machines run.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::kernels {

// Lower-case names of the targets this build compiled and this CPU can run, best first
// ("avx3" is AVX-512 F/BW/DQ/VL; "emu128" is Highway's portable fallback).
std::vector<std::string> AvailableIsas();

// Restricts dispatch to `name` (case-insensitive; "avx512" also names avx3) or worse targets:
// every kernel call from then on runs that target's code. InvalidArgument names the known or
// available targets when `name` is unknown or the CPU cannot run it. Call before kernels run on
// other threads (at start, from flags).
Status SelectIsa(std::string_view name);

// Applies MOESERVE_ISA when set ("" or unset: no restriction); an error names the variable.
Status SelectIsaFromEnvironment();

// The target the kernels dispatch to now, lower-case ("avx3", "avx2", ...).
std::string ActiveIsa();

}  // namespace moeserve::kernels
