#include "cli/latency_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string_view>
#include <vector>

namespace moeserve::cli {
namespace {

using nlohmann::ordered_json;

// Text for HTML or SVG content and attribute values.
std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

double Number(const ordered_json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}
std::string Text(const ordered_json& j, const char* key) {
  if (!j.contains(key)) return "";
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

// A round axis top above `v`: 1, 2, 2.5 or 5 times a power of ten.
double NiceCeiling(double v) {
  if (!(v > 0)) return 1;
  const double power = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * power >= v) return m * power;
  }
  return 10 * power;
}

// The plot area of one chart in SVG pixels, y from `low` (0 unless a waterfall's running sum
// goes below it) to `top` (axis values).
struct Plot {
  static constexpr double kWidth = 640, kHeight = 300;
  static constexpr double kLeft = 64, kRight = 16, kTop = 16, kBottom = 56;
  double top = 1;
  double low = 0;
  double Y(double v) const {
    return kTop + (kHeight - kTop - kBottom) * (top - v) / (top - low);
  }
  double Bottom() const { return kHeight - kBottom; }
  double Width() const { return kWidth - kLeft - kRight; }
  // The centre of slot i of n along x.
  double X(size_t i, size_t n) const { return kLeft + Width() * (static_cast<double>(i) + 0.5) / n; }
};

// The y axis: grid lines and labels at fifths of the top, and the axis title.
std::string YAxis(const Plot& p, const std::string& title) {
  std::string svg;
  for (int i = 0; i <= 5; ++i) {
    const double v = p.low + (p.top - p.low) * i / 5, y = p.Y(v);
    svg += fmt::format(
        "<line class=\"grid\" x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>"
        "<text class=\"tick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n",
        Plot::kLeft, Plot::kWidth - Plot::kRight, y, y, Plot::kLeft - 6, y + 4, v);
  }
  svg += fmt::format(
      "<text class=\"axis-title\" transform=\"translate(14 {:.1f}) rotate(-90)\" "
      "text-anchor=\"middle\">{}</text>\n",
      (Plot::kTop + p.Bottom()) / 2, Escape(title));
  return svg;
}

std::string OpenSvg(const std::string& chart, const std::string& title) {
  return fmt::format(
      "<svg data-chart=\"{}\" role=\"img\" aria-label=\"{}\" viewBox=\"0 0 {} {}\" width=\"{}\" "
      "height=\"{}\">\n",
      chart, Escape(title), Plot::kWidth, Plot::kHeight, Plot::kWidth, Plot::kHeight);
}

// The ablation as a waterfall: the everything-on bar from 0, each optimization's cost when off
// floating from the running sum, the sum as the last bar.
std::string AblationChart(const ordered_json& r) {
  if (!r.contains("ablation") || !r["ablation"].is_array() || r["ablation"].empty()) {
    return "<p class=\"none\" data-chart=\"ablation\" data-empty=\"true\">Not measured: run "
           "<code>bench latency --ablation</code>.</p>\n";
  }
  const ordered_json& rows = r["ablation"];
  std::vector<double> on_runs;
  for (const ordered_json& v : r.value("ablation_baseline_tpot_ms", ordered_json::array())) {
    if (v.is_number()) on_runs.push_back(v.get<double>());
  }
  std::sort(on_runs.begin(), on_runs.end());
  // The baseline is the median the table's change % is against: tpot / (1 + change).
  const ordered_json& first = rows.front();
  const double baseline = Number(first, "tpot_ms") / (1 + Number(first, "change_pct") / 100);
  struct Bar {
    std::string label, title, series;
    double from, to, value;
  };
  std::vector<Bar> bars = {{"all on", "everything on", "baseline", 0, baseline, baseline}};
  double sum = baseline;
  for (const ordered_json& row : rows) {
    const std::string name = Text(row, "optimization");
    const double delta = Number(row, "tpot_ms") - baseline;
    bars.push_back({name.substr(0, name.find(' ')), name, delta >= 0 ? "cost" : "gain", sum,
                    sum + delta, delta});
    sum += delta;
  }
  bars.push_back({"all off", "sum: everything off, if the effects added up", "total", 0, sum, sum});
  // The axis spans every bar: when turning optimizations off made the run faster (a tiny model
  // can), the running sum may end below zero, and the bars below it must stay on the chart.
  double high = 0, low = 0;
  for (const Bar& b : bars) {
    high = std::max({high, b.from, b.to});
    low = std::min({low, b.from, b.to});
  }
  Plot p{.top = NiceCeiling(high * 1.05), .low = low < 0 ? -NiceCeiling(-low * 1.05) : 0.0};
  std::string svg = OpenSvg("ablation", "TPOT with each optimization off in turn");
  svg += YAxis(p, "TPOT ms");
  if (p.low < 0) {
    svg += fmt::format("<line class=\"zero\" x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>\n",
                       Plot::kLeft, Plot::kWidth - Plot::kRight, p.Y(0), p.Y(0));
  }
  const double band = p.Width() / bars.size();
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    // At least a pixel, so that a change too small to see is still drawn.
    const double y0 = p.Y(std::max(b.from, b.to)), y1 = p.Y(std::min(b.from, b.to));
    const double height = std::max(1.0, y1 - y0);
    const double x = Plot::kLeft + band * i + band * 0.15;
    svg += fmt::format(
        "<rect class=\"bar {}\" data-series=\"{}\" data-label=\"{}\" data-value=\"{:.3f}\" "
        "x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\"><title>{}: {:+.3f} ms"
        "</title></rect>\n",
        b.series, b.series, Escape(b.label), b.value, x, y0, band * 0.7, height,
        Escape(b.title), b.value);
    if (i + 1 < bars.size()) {  // the step to the next bar's start
      svg += fmt::format(
          "<line class=\"step\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>\n",
          x + band * 0.7, x + band, p.Y(b.to), p.Y(b.to));
    }
    svg += fmt::format(
        "<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
        p.X(i, bars.size()), p.Bottom() + 16, Escape(b.label));
    const std::string value =
        i == 0 || i + 1 == bars.size() ? fmt::format("{:.2f}", b.value)
                                       : fmt::format("{:+.2f}", b.value);
    svg += fmt::format(
        "<text class=\"value\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
        p.X(i, bars.size()), y0 - 4, value);
  }
  svg += "</svg>\n";
  std::string table =
      "<table><tr><th>optimization off</th><th>TPOT ms</th><th>change</th><th>flag</th></tr>\n";
  table += fmt::format(
      "<tr><td>(none: everything on)</td><td class=\"num\">{:.2f}</td><td></td><td></td></tr>\n",
      baseline);
  for (const ordered_json& row : rows) {
    table += fmt::format("<tr><td>{}</td><td class=\"num\">{:.2f}</td><td class=\"num\">{:+.1f} %"
                         "</td><td><code>{}</code></td></tr>\n",
                         Escape(Text(row, "optimization")), Number(row, "tpot_ms"),
                         Number(row, "change_pct"), Escape(Text(row, "flag")));
  }
  table += "</table>\n";
  const std::string spread =
      on_runs.empty() ? ""
                      : fmt::format(" Everything on ranged {:.2f}&ndash;{:.2f} ms over the {} "
                                    "rounds: a change inside that spread is noise.",
                                    on_runs.front(), on_runs.back(), on_runs.size());
  return svg + fmt::format("<p class=\"caption\">Medians of interleaved rounds.{}</p>\n", spread) +
         table;
}

// One series against batch size: a polyline with a point per run, and optionally a horizontal
// reference line (the roofline).
std::string BatchChart(const std::string& chart, const std::string& title,
                       const std::string& y_title, const ordered_json& runs, const char* key,
                       double reference, const std::string& reference_label) {
  double high = reference;
  for (const ordered_json& run : runs) high = std::max(high, Number(run, key));
  Plot p{.top = NiceCeiling(high * 1.1)};
  std::string svg = OpenSvg(chart, title);
  svg += YAxis(p, y_title);
  const size_t n = runs.size();
  std::string points;
  for (size_t i = 0; i < n; ++i) {
    points += fmt::format("{:.1f},{:.1f} ", p.X(i, n), p.Y(Number(runs[i], key)));
  }
  svg += fmt::format("<polyline class=\"series\" points=\"{}\"/>\n", points);
  for (size_t i = 0; i < n; ++i) {
    const double v = Number(runs[i], key);
    const std::string batch = Text(runs[i], "batch_size");
    svg += fmt::format(
        "<circle class=\"point\" data-series=\"{}\" data-label=\"{}\" data-value=\"{:.3f}\" "
        "cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\"><title>batch {}: {:.2f}</title></circle>\n"
        "<text class=\"value\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.2f}</text>\n"
        "<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
        key, batch, v, p.X(i, n), p.Y(v), batch, v, p.X(i, n), p.Y(v) - 10, v, p.X(i, n),
        p.Bottom() + 16, batch);
  }
  if (reference > 0) {
    const double y = p.Y(reference);
    svg += fmt::format(
        "<line class=\"reference\" data-series=\"roofline\" data-value=\"{:.3f}\" x1=\"{}\" "
        "x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\"><title>{}</title></line>\n"
        "<text class=\"reference-label\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
        reference, Plot::kLeft, Plot::kWidth - Plot::kRight, y, y, Escape(reference_label),
        Plot::kWidth - Plot::kRight - 4, y - 6, Escape(reference_label));
  }
  svg += fmt::format(
      "<text class=\"axis-title\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">batch size "
      "(concurrent requests)</text>\n</svg>\n",
      Plot::kLeft + p.Width() / 2, Plot::kHeight - 12);
  return svg;
}

constexpr char kStyle[] = R"(
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 720px; color: #1d2330; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; }
dt { color: #5a6372; } dd { margin: 0; }
table { border-collapse: collapse; margin-top: 8px; } td, th { padding: 2px 10px; text-align: left; }
th { border-bottom: 1px solid #c8ccd4; white-space: nowrap; }
td.num { text-align: right; white-space: nowrap; }
svg { display: block; background: #fafbfc; border: 1px solid #e3e6eb; }
.grid { stroke: #e3e6eb; } .tick, .label, .value { font-size: 11px; fill: #5a6372; }
.axis-title { font-size: 12px; fill: #1d2330; }
.bar.baseline, .bar.total { fill: #5a6f99; } .bar.cost { fill: #d0653c; } .bar.gain { fill: #3c9d6e; }
.step { stroke: #8a93a3; stroke-dasharray: 3 2; } .zero { stroke: #5a6372; }
.series { fill: none; stroke: #3767c8; stroke-width: 2; } .point { fill: #3767c8; }
.reference { stroke: #c03a3a; stroke-width: 1.5; stroke-dasharray: 6 4; }
.reference-label { font-size: 11px; fill: #c03a3a; }
.caption, .none { color: #5a6372; }
)";

}  // namespace

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "";
}

std::string RenderLatencyReport(const ordered_json& r) {
  const ordered_json runs = r.value("runs", ordered_json::array());
  const double roofline = runs.empty() ? 0 : Number(runs.front(), "roofline_tok_s");
  std::string isas;
  for (const ordered_json& isa : r.value("isas_available", ordered_json::array())) {
    isas += (isas.empty() ? "" : ", ") + (isa.is_string() ? isa.get<std::string>() : isa.dump());
  }
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<title>moeserve bench latency: {}</title>\n<style>{}</style></head><body>\n"
      "<h1>moeserve bench latency</h1>\n",
      Escape(Text(r, "model")), kStyle);
  html += "<h2>Machine and run</h2>\n<dl id=\"machine\">\n";
  const std::vector<std::pair<std::string, std::string>> facts = {
      {"CPU", Text(r, "cpu")},
      {"SIMD in use", Text(r, "isa")},
      {"SIMD available", isas},
      {"threads", Text(r, "threads")},
      {"read bandwidth", fmt::format("{:.1f} GB/s (measured in this run)", Number(r, "bandwidth_gbs"))},
      {"f32 FMA peak", fmt::format("{:.1f} GFLOP/s (measured in this run)", Number(r, "fma_peak_gflops"))},
      {"model", Text(r, "model")},
      {"weights", Text(r, "weight_dtype")},
      {"bytes per token", fmt::format("{:.1f} MB", Number(r, "bytes_per_token") * 1e-6)},
      {"roofline", fmt::format("{:.1f} tok/s (one sequence: bandwidth / bytes per token)", roofline)},
      {"ranks", fmt::format("--tp {}{}", Text(r, "tp"), r.value("ep", false) ? " --ep" : "")}};
  for (const auto& [key, value] : facts) {
    html += fmt::format("<dt>{}</dt><dd data-fact=\"{}\">{}</dd>\n", Escape(key), Escape(key),
                        Escape(value));
  }
  html += "</dl>\n<h2>Ablation: what each optimization is worth</h2>\n";
  html += "<p class=\"caption\">Batch " +
          (runs.empty() ? std::string("?") : Text(runs.front(), "batch_size")) +
          ". The first bar is TPOT with everything on; each next bar is what switching one "
          "optimization off adds (red) or saves (green); the last is their sum.</p>\n";
  html += AblationChart(r);
  html += "<h2>Time per output token</h2>\n";
  html += BatchChart("tpot", "TPOT against batch size", "TPOT ms", runs, "tpot_ms", 0, "");
  html += "<h2>Aggregate decode rate</h2>\n";
  html += BatchChart("throughput", "aggregate decode tok/s against batch size", "tokens/s", runs,
                     "decode_tok_s", roofline,
                     fmt::format("roofline, one sequence: {:.1f} tok/s", roofline));
  html += "<table><tr><th>batch</th><th>prefill tok/s</th><th>of FMA peak</th><th>TPOT ms</th>"
          "<th>decode tok/s</th><th>of roofline</th></tr>\n";
  for (const ordered_json& run : runs) {
    html += fmt::format(
        "<tr><td class=\"num\">{}</td><td class=\"num\">{:.1f}</td><td class=\"num\">{:.1f} %"
        "</td><td class=\"num\">{:.2f}</td><td class=\"num\">{:.1f}</td><td class=\"num\">"
        "{:.1f} %</td></tr>\n",
        Text(run, "batch_size"), Number(run, "prefill_tok_s"),
        100 * Number(run, "prefill_peak_ratio"), Number(run, "tpot_ms"),
        Number(run, "decode_tok_s"), 100 * Number(run, "roofline_ratio"));
  }
  html += "</table>\n</body></html>\n";
  return html;
}

}  // namespace moeserve::cli
