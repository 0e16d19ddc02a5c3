#include "html_reliability.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "html_report.hpp"
#include "html_svg.hpp"

namespace moesim::tools {

using namespace html;

namespace {

/// Step times of a straggler run, one bar per step, against the same step with nothing slow.
std::string chart_step_times(const strategies::StragglerResult& sr) {
  const double W = 1000, left = 70, top = 20, plot_w = 880, plot_h = 200;
  double vmax = sr.ideal_step_s;
  for (double t : sr.step_times_s) vmax = std::max(vmax, t);
  const ZeroAxis axis = zero_axis(vmax, 6, left, top, plot_w, plot_h, " s");
  const double sy = axis.px_per_unit;
  std::string s = axis.grid;
  const std::size_t n = sr.step_times_s.size();
  const double bw = plot_w / static_cast<double>(std::max<std::size_t>(n, 1));
  for (std::size_t i = 0; i < n; ++i) {
    const double v = sr.step_times_s[i], x = left + i * bw + bw * 0.15, h = v * sy;
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"dot0\"><title>step {}: {:.3f} s</title></rect>\n",
                     f1(x), f1(top + plot_h - h), f1(bw * 0.7), f1(h), i, v);
    if (n <= 40) s += text(x + bw * 0.35, top + plot_h + 14, std::to_string(i), "middle", "small");
  }
  const double yi = top + plot_h - sr.ideal_step_s * sy;
  s += line(left, yi, left + plot_w, yi, "axis");
  s += text(left + plot_w, yi - 4, fmt::format("nothing slow: {:.3f} s", sr.ideal_step_s), "end", "small");
  s += line(left, top, left, top + plot_h, "axis");
  s += line(left, top + plot_h, left + plot_w, top + plot_h, "axis");
  s += text(left + plot_w / 2, top + plot_h + 30, "step", "middle", "small");
  return svg_open("chart-step-times", W, top + plot_h + 40, "step time of every simulated step (seconds)") + s + "</svg>\n";
}

/// Goodput against the checkpoint interval (log scale), as the expected-run simulation found it.
std::string chart_goodput(const strategies::CapacityPoint& p) {
  const double W = 1000, left = 70, top = 20, plot_w = 880, plot_h = 220;
  const auto& curve = p.goodput.curve;
  double lo = 1e18, hi = 0, gmin = 1;
  for (const auto& [tau, g] : curve) {
    lo = std::min(lo, std::log10(tau));
    hi = std::max(hi, std::log10(tau));
    gmin = std::min(gmin, g);
  }
  // y from a round floor below the worst goodput to 100%: the axis says where it starts.
  const double floor_pct = std::max(0.0, std::floor(100 * gmin / 5) * 5 - 5);
  const double sy = plot_h / (100 - floor_pct);
  auto xpos = [&](double tau) { return hi > lo ? left + (std::log10(tau) - lo) / (hi - lo) * plot_w : left + plot_w / 2; };
  auto ypos = [&](double g) { return top + plot_h - (100 * g - floor_pct) * sy; };
  std::string s;
  for (double v = floor_pct; v <= 100 + 1e-9; v += 5) {
    s += line(left, ypos(v / 100), left + plot_w, ypos(v / 100), "grid");
    s += text(left - 6, ypos(v / 100) + 4, fmt::format("{:.0f}%", v), "end", "small");
  }
  // Labelled ticks at 1, 2 and 5 x each decade inside the range (a decade alone gives one or two).
  for (int e = static_cast<int>(std::floor(lo)); e <= static_cast<int>(std::floor(hi)); ++e)
    for (const double m : {1.0, 2.0, 5.0}) {
      const double tau = m * std::pow(10.0, e);
      if (std::log10(tau) < lo - 1e-9 || std::log10(tau) > hi + 1e-9) continue;
      s += line(xpos(tau), top + plot_h, xpos(tau), top + plot_h + 4, "axis");
      s += text(xpos(tau), top + plot_h + 14, fmt::format("{:g} s", tau), "middle", "small");
    }
  std::string poly;
  for (const auto& [tau, g] : curve) {
    poly += fmt::format("{},{} ", f1(xpos(tau)), f1(ypos(g)));
    s += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" class=\"dot0\"><title>every {:.0f} s: {:.2f}%</title></circle>\n",
                     f1(xpos(tau)), f1(ypos(g)), tau, 100 * g);
  }
  if (!poly.empty()) {
    poly.pop_back();
    s += fmt::format("<polyline points=\"{}\" class=\"line0\"/>\n", poly);
  }
  s += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"8\" class=\"ring\"/>\n", f1(xpos(p.goodput.interval_s)),
                   f1(ypos(p.goodput.goodput)));
  if (p.goodput.young_interval_s >= std::pow(10.0, lo) && p.goodput.young_interval_s <= std::pow(10.0, hi)) {
    const double xy = xpos(p.goodput.young_interval_s);
    s += line(xy, top, xy, top + plot_h, "grid");
    s += text(xy + 4, top + 12, "Young", "start", "small");
  }
  s += line(left, top, left, top + plot_h, "axis");
  s += line(left, top + plot_h, left + plot_w, top + plot_h, "axis");
  s += text(left + plot_w / 2, top + plot_h + 32, "checkpoint interval (log scale)", "middle", "small");
  s += text(left + 6, top + plot_h - 6, fmt::format("goodput; the axis starts at {:.0f}%", floor_pct), "start", "small");
  return svg_open("chart-goodput", W, top + plot_h + 42, "goodput (percent) against the checkpoint interval") + s + "</svg>\n";
}

}  // namespace

/// The capacity point whose goodput the report draws: the answer, else the fastest (null: none
/// with failures modelled).
const strategies::CapacityPoint* reliability_point(const strategies::CapacityReport* cap) {
  if (cap == nullptr) return nullptr;
  const strategies::CapacityPoint* p = cap->answer ? &cap->points[*cap->answer] : cap->fastest ? &cap->points[*cap->fastest] : nullptr;
  return p != nullptr && p->reliability && !p->goodput.curve.empty() ? p : nullptr;
}

std::string section_reliability(const strategies::Result& r, const strategies::CapacityReport* cap) {
  std::string h = "<section id=\"reliability\">\n<h2>Stragglers and failures</h2>\n";
  if (r.stragglers) {
    const auto& sr = *r.stragglers;
    h += figure(chart_step_times(sr),
                html_escape(fmt::format("{} slow device{} and {} slow NIC{}; mean {:.3f} s, p50 {:.3f} s, p99 {:.3f} s against "
                                        "{:.3f} s with nothing slow ({:+.1f}%; the axis starts at zero). Step {} is the one the "
                                        "rest of the report shows.",
                                        sr.slow_devices, sr.slow_devices == 1 ? "" : "s", sr.slow_nics, sr.slow_nics == 1 ? "" : "s", sr.mean_s, sr.p50_s, sr.p99_s, sr.ideal_step_s,
                                        sr.ideal_step_s > 0 ? 100 * (sr.mean_s / sr.ideal_step_s - 1) : 0.0, sr.reported_step)));
    h += "<table>\n<tr><th>stage</th><th>device</th><th>why</th><th>holds back</th><th class=\"n\">its stage waits s</th></tr>\n";
    for (const auto& g : sr.gates) {
      std::string what;
      for (const auto& x : g.gates) what += (what.empty() ? "" : ", ") + x;
      h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{:.3f}</td></tr>\n", g.stage, g.device,
                       html_escape(g.slowdown > 1 ? fmt::format("{:.2f}x slower", g.slowdown) : std::string()) +
                           html_escape(g.nic_bandwidth < 1 ? fmt::format(" NIC at {:.0f}%", 100 * g.nic_bandwidth) : std::string()),
                       html_escape(what), g.wait_s);
    }
    h += "</table>\n";
  } else {
    h += "<p class=\"note\">No stragglers in this scenario (<code>simulation.stragglers</code> adds slow devices, slow NICs "
         "and host jitter).</p>\n";
  }
  if (const strategies::CapacityPoint* p = reliability_point(cap); p != nullptr) {
    h += figure(chart_goodput(*p),
                html_escape(fmt::format("{} devices: {:.1f}% goodput at the best interval (ring, every {:.0f} s; Young's formula "
                                        "gives {:.0f} s); {:.0f} interruptions expected over {:.1f} days ({:.1f} without "
                                        "failures). Assumptions ({}) are listed under the capacity table.",
                                        p->devices, 100 * p->goodput.goodput, p->goodput.interval_s, p->goodput.young_interval_s,
                                        p->goodput.failures, p->days, p->days_failure_free, cap->reliability.name)));
  } else {
    h += "<p class=\"note\">No capacity plan with failures in this report (<code>reliability</code> \"none\", or no "
         "sweep).</p>\n";
  }
  return h + "</section>\n";
}

}  // namespace moesim::tools
