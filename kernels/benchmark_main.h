// The main of the benchmarks that time kernels: MOESERVE_ISA (avx2, ...) restricts the SIMD
// target first, as it does for moeserve itself, then Google Benchmark runs. Benchmarks only.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>

#include "core/status.h"
#include "kernels/isa.h"

namespace moeserve::kernels {

inline int BenchmarkMainWithIsa(int argc, char** argv, const char* name) {
  if (const Status isa = SelectIsaFromEnvironment(); !isa.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, isa.message().c_str());
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace moeserve::kernels
