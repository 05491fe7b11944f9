// bench latency --report's waterfall: every bar inside the chart and drawn to one scale, also
// when the running sum of the ablation's changes goes below zero (switching optimizations off
// made a tiny model faster; the browser test met it only when the timing fell that way).
#include "cli/latency_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

namespace moeserve::cli {
namespace {

struct Bar {
  double value, y, height;
};

std::vector<Bar> AblationBars(const std::string& html) {
  const std::regex bar(
      "<rect class=\"bar [a-z]+\" data-series=\"[a-z]+\" data-label=\"[^\"]*\" "
      "data-value=\"([-0-9.]+)\" x=\"[-0-9.]+\" y=\"([-0-9.]+)\" width=\"[-0-9.]+\" "
      "height=\"([-0-9.]+)\"");
  std::vector<Bar> bars;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), bar); it != std::sregex_iterator();
       ++it) {
    bars.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3])});
  }
  return bars;
}

TEST(LatencyReportTest, WaterfallBarsStayInsideWhenTheSumGoesBelowZero) {
  for (double change : {+20.0, -45.0, -80.0}) {  // costs only; gains summing to below zero
    nlohmann::ordered_json r;
    r["ablation_baseline_tpot_ms"] = {0.30};
    r["ablation"] = nlohmann::ordered_json::array();
    for (const char* name : {"#1 a", "#5 b", "#8/#9 c"}) {
      r["ablation"].push_back(
          {{"optimization", name}, {"tpot_ms", 0.30 * (1 + change / 100)}, {"change_pct", change}});
    }
    const std::vector<Bar> bars = AblationBars(RenderLatencyReport(r));
    ASSERT_EQ(bars.size(), 5u) << "everything on, three rows, the sum";
    const double scale = bars[0].height / bars[0].value;  // pixels per ms
    for (const Bar& b : bars) {
      EXPECT_GE(b.y, 0.0) << "change " << change;
      EXPECT_LE(b.y + b.height, 300.0) << "change " << change << ": below the chart";
      EXPECT_NEAR(b.height, std::max(1.0, std::fabs(b.value) * scale), 0.2) << "change " << change;
    }
  }
}

}  // namespace
}  // namespace moeserve::cli
