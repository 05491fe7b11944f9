// `bench latency --report FILE.html`: the run's results as one self-contained page -- inline SVG
// and CSS, no script, no external asset -- that opens anywhere, offline:
//   - the machine: CPU, SIMD target in use and available, threads, measured read bandwidth,
//     model, weight format, bytes per token, the roofline;
//   - the ablation as a waterfall: TPOT with everything on, then each optimization's cost when
//     switched off (TPOT off - TPOT on) stacked on it, ending in the sum (what switching all of
//     them off would cost if their effects added up);
//   - TPOT against batch size;
//   - aggregate decode tok/s against batch size, with the single-sequence roofline as a line.
// Every data mark carries data-series / data-label / data-value attributes (the value as
// printed in the table beside the chart), so a test can read the drawn data back from the DOM.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace moeserve::cli {

// `results` is what `bench latency --json` writes (its keys: isa, runs, ablation, ...) plus
// "cpu" (the processor's name) and "isas_available".
std::string RenderLatencyReport(const nlohmann::ordered_json& results);

// The processor's name as /proc/cpuinfo gives it ("" when it cannot be read).
std::string CpuModelName();

}  // namespace moeserve::cli
