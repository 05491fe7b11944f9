// The main of the benchmarks that time kernels: --isa NAME (or --isa=NAME; avx2, ...) or else
// MOESERVE_ISA restricts the SIMD target first, as moeserve's --isa does, then Google Benchmark
// runs with the other arguments. Benchmarks only.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "core/status.h"
#include "kernels/isa.h"

namespace moeserve::kernels {

inline int BenchmarkMainWithIsa(int argc, char** argv, const char* name) {
  std::string isa_flag;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
      isa_flag = argv[++i];
    } else if (std::strncmp(argv[i], "--isa=", 6) == 0) {
      isa_flag = argv[i] + 6;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  const Status isa = isa_flag.empty() ? SelectIsaFromEnvironment() : SelectIsa(isa_flag);
  if (!isa.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, isa.message().c_str());
    return 2;
  }
  std::fprintf(stderr, "%s: isa %s\n", name, ActiveIsa().c_str());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace moeserve::kernels
