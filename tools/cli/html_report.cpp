#include "html_report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "html_charts.hpp"
#include "html_reliability.hpp"
#include "html_svg.hpp"
#include "report.hpp"

namespace moesim::tools {
namespace {

using namespace html;  // number formats and SVG primitives (html_svg.hpp)

using strategies::Breakdown;


// ---- categories and colours ---------------------------------------------------------------

/// Task categories of the lowering (strategies::Cat order) and their colours; the breakdown
/// parts reuse them so a colour means the same thing in every chart.
struct CatStyle {
  const char* name;
  const char* label;
  const char* color;
};
constexpr std::array<CatStyle, strategies::kNumCats> kCatStyles{{
    {"compute", "compute", "#4e79a7"},
    {"recompute", "recompute", "#a0cbe8"},
    {"tp_comm", "TP comm", "#f28e2b"},
    {"cp_comm", "CP comm", "#ffbe7d"},
    {"ep_comm", "expert all-to-all", "#e15759"},
    {"pp_comm", "pipeline send/recv", "#59a14f"},
    {"dp_comm", "DP comm", "#76b7b2"},
    {"optimizer", "optimizer and other", "#b07aa1"},
    {"swap", "swap to host", "#9c755f"},
    {"launch", "host launch", "#bab0ac"},
}};

/// Breakdown parts in the order they are stacked. `cls` is a CSS class (k<category> for parts
/// that are a task category, or one of the extra classes below).
struct Part {
  const char* label;
  const char* cls;
  double (*value)(const Breakdown&);
};
const std::array<Part, 12> kParts{{
    {"compute", "k0", [](const Breakdown& b) { return std::max(0.0, b.compute_s - b.recompute_s); }},
    {"recompute", "k1", [](const Breakdown& b) { return b.recompute_s; }},
    {"TP comm (exposed)", "k2", [](const Breakdown& b) { return b.tp_comm_s; }},
    {"CP comm (exposed)", "k3", [](const Breakdown& b) { return b.cp_comm_s; }},
    {"expert all-to-all (exposed)", "k4", [](const Breakdown& b) { return b.ep_comm_s; }},
    {"pipeline send/recv (exposed)", "k5", [](const Breakdown& b) { return b.pp_comm_s; }},
    {"DP comm (exposed)", "k6", [](const Breakdown& b) { return b.dp_comm_s; }},
    {"pipeline bubble", "kb", [](const Breakdown& b) { return b.bubble_s; }},
    {"expert imbalance wait", "ki", [](const Breakdown& b) { return b.imbalance_wait_s; }},
    {"swap (exposed)", "k8", [](const Breakdown& b) { return b.swap_s; }},
    {"host-bound", "kh", [](const Breakdown& b) { return b.host_bound_s; }},
    {"optimizer and other", "k7", [](const Breakdown& b) { return b.other_s; }},
}};

std::string css() {
  std::string c = R"(
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  color: #1d1d1f; background: #fff; max-width: 1100px; margin: 24px auto; padding: 0 16px; line-height: 1.45; }
h1 { font-size: 1.6em; margin: 0 0 4px; }
h2 { font-size: 1.25em; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
p.sub, .note, figcaption { color: #555; }
.note { font-size: 0.92em; }
.warn { color: #a01d1d; font-weight: 600; }
.ok { color: #1d6b2a; font-weight: 600; }
table { border-collapse: collapse; font-size: 0.9em; margin: 6px 0 10px; }
th, td { border-bottom: 1px solid #e3e3e3; padding: 3px 9px; text-align: left; vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.hl td { background: #eef5ee; font-weight: 600; }
tr.bad td { color: #888; }
table.kv td:first-child { color: #555; padding-right: 18px; }
code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 0.85em; }
pre { background: #f6f6f6; border: 1px solid #e3e3e3; padding: 8px; white-space: pre-wrap; word-break: break-all; }
figure { margin: 8px 0 16px; }
figure svg { width: 100%; height: auto; display: block; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; font-size: 12px; fill: #222; }
svg text.small { font-size: 10px; fill: #555; }
svg text.title { font-size: 13px; font-weight: 600; }
svg .axis { stroke: #888; stroke-width: 1; }
svg .grid { stroke: #e6e6e6; stroke-width: 1; }
svg .cap { stroke: #c0392b; stroke-width: 2; stroke-dasharray: 6 4; }
svg .line0 { fill: none; stroke: #4e79a7; stroke-width: 2; }
svg .line1 { fill: none; stroke: #e15759; stroke-width: 2; }
svg .dot0 { fill: #4e79a7; }
svg .dot1 { fill: #e15759; }
svg .ring { fill: none; stroke: #1d6b2a; stroke-width: 2.5; }
svg .bad { stroke: #999; stroke-width: 2; }
svg .idle { fill: #f0f0f0; }
svg .idle2 { fill: #fafafa; }
svg .kb { fill: #d9d9d9; stroke: #bdbdbd; stroke-width: 0.5; }
svg .ki { fill: #f1ce63; }
svg .kh { fill: #79706e; }
svg .sf0 { fill: #4e79a7; }
svg .sf1 { fill: #7aa6d1; }
svg .sb0 { fill: #e8772e; }
svg .sb1 { fill: #f5ab6e; }
svg .st0 { fill: #9aa9b8; }
svg .st1 { fill: #c3ced8; }
svg .ideal { stroke: #777; stroke-width: 1.5; stroke-dasharray: 5 4; }
svg text.tiny { font-size: 8px; fill: #fff; }
svg text.inbar { font-size: 10px; fill: #fff; }
footer { margin-top: 32px; font-size: 0.85em; color: #666; border-top: 1px solid #ddd; padding-top: 6px; }
@page { size: A4; margin: 12mm; }
@media print {
  body { max-width: none; margin: 0; padding: 0; font-size: 10pt; }
  section, figure, table, tr { break-inside: avoid; page-break-inside: avoid; }
  h2 { break-after: avoid; page-break-after: avoid; }
  figure svg { max-width: 100%; }
}
)";
  for (std::size_t i = 0; i < kCatStyles.size(); ++i)
    c += fmt::format("svg .k{} {{ fill: {}; }}\n", i, kCatStyles[i].color);
  for (std::size_t i = 0; i < kMemParts.size(); ++i) c += fmt::format("svg .m{} {{ fill: {}; }}\n", i, kMemParts[i].color);
  return c;
}


// ---- charts --------------------------------------------------------------------------------

struct Bar {
  std::string label;
  Breakdown b;
  double total = 0;
};

std::string chart_breakdown(const std::vector<Bar>& bars) {
  // Labels are plan names in a 12px sans font (about 6.6 px a character); long ones drop to the
  // 10px font (about 5.6 px) so none runs past the left edge.
  std::size_t longest = 0;
  for (const auto& b : bars) longest = std::max(longest, b.label.size());
  const bool small_labels = 16 + 6.6 * static_cast<double>(longest) > 470;
  const double per_char = small_labels ? 5.6 : 6.6;
  const double W = 1000, label_w = std::clamp(16 + per_char * static_cast<double>(longest), 200.0, 520.0), right = 70;
  const double plot_w = W - label_w - right;
  const double row_h = 22, gap = 9, top = 8;
  double xmax = 0;
  for (const auto& b : bars) xmax = std::max(xmax, b.total);
  const double step = nice_step(xmax, 8);
  const double axis_max = std::max(step, std::ceil(xmax / step - 1e-9) * step);
  const double sx = plot_w / axis_max;
  const double plot_h = static_cast<double>(bars.size()) * (row_h + gap);
  std::vector<std::pair<std::string, std::string>> items;
  for (const auto& p : kParts) {
    bool used = false;
    for (const auto& b : bars) used = used || p.value(b.b) > 0;
    if (used) items.emplace_back(p.label, p.cls);
  }
  auto [leg, leg_h] = legend(items, label_w, top + plot_h + 40, plot_w + right, true);
  const double H = top + plot_h + 40 + leg_h + 6;
  std::string s = svg_open("chart-breakdown", W, H, "step-time breakdown, stacked per plan");
  const int dec = decimals_for(step);
  for (double t = 0; t <= axis_max + step * 1e-6; t += step) {
    const double x = label_w + t * sx;
    s += line(x, top, x, top + plot_h, "grid");
    s += text(x, top + plot_h + 15, fmt::format("{:.{}f}", t, dec), "middle", "small");
  }
  s += text(label_w + plot_w / 2, top + plot_h + 31, "seconds per step (per device; the parts add up to the step time)",
            "middle", "small");
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const double y = top + static_cast<double>(i) * (row_h + gap);
    s += text(label_w - 8, y + row_h / 2 + 4, bars[i].label, "end", small_labels ? "small" : nullptr);
    double x = label_w;
    for (const auto& p : kParts) {
      const double v = p.value(bars[i].b);
      if (v <= 0) continue;
      const double w = v * sx;
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"{}\"><title>{}: {:.3f} s ({:.1f}%)</title></rect>\n",
                       f1(x), f1(y), fmt::format("{:.2f}", w), f1(row_h), p.cls, html_escape(p.label), v,
                       bars[i].total > 0 ? 100 * v / bars[i].total : 0.0);
      x += w;
    }
    s += text(x + 5, y + row_h / 2 + 4, fmt::format("{:.3f} s", bars[i].total), "start", "small");
  }
  s += line(label_w, top, label_w, top + plot_h, "axis");
  s += leg;
  s += "</svg>\n";
  return s;
}

/// One step of the simulated ranks: per rank a compute lane and a communication lane. Tasks
/// are binned into `bins` time columns; a column shows the category busy longest in it when
/// the lane is busy at least half of the column, and equal neighbours merge into one rectangle.
std::string chart_timeline(const strategies::Simulation& sim, int max_rows, int bins, std::string& note) {
  using strategies::Stream;
  const auto& g = sim.lowered.graph;
  const auto& run = sim.run;
  const auto& ranks = sim.lowered.ranks;
  const Tick makespan = std::max<Tick>(1, run.makespan);
  bins = std::max(50, bins);

  // Rows: every simulated rank when few; else the first simulated rank of each stage, then an
  // even sample of those.
  std::vector<std::size_t> rows;
  if (static_cast<int>(ranks.size()) <= max_rows) {
    for (std::size_t i = 0; i < ranks.size(); ++i) rows.push_back(i);
  } else {
    std::vector<std::size_t> firsts;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      bool seen = false;
      for (std::size_t f : firsts) seen = seen || ranks[f].stage == ranks[i].stage;
      if (!seen) firsts.push_back(i);
    }
    std::sort(firsts.begin(), firsts.end(), [&](std::size_t a, std::size_t b) { return ranks[a].stage < ranks[b].stage; });
    if (static_cast<int>(firsts.size()) <= max_rows) {
      rows = firsts;
    } else {
      for (int k = 0; k < max_rows; ++k) rows.push_back(firsts[firsts.size() * static_cast<std::size_t>(k) / max_rows]);
    }
    note = fmt::format("Showing {} of the {} simulated ranks (one per pipeline stage{}).", rows.size(), ranks.size(),
                       rows.size() < firsts.size() ? ", evenly sampled" : "");
  }
  bool multi_per_stage = false;
  for (std::size_t a = 0; a < rows.size(); ++a)
    for (std::size_t b = a + 1; b < rows.size(); ++b) multi_per_stage = multi_per_stage || ranks[rows[a]].stage == ranks[rows[b]].stage;

  // Stream resource -> (row, lane).
  const int nc = static_cast<int>(strategies::kNumCats);
  std::vector<std::pair<int, int>> where(g.num_resources(), {-1, -1});
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto& sr = ranks[rows[r]];
    for (int st = 0; st < strategies::kNumStreams; ++st) {
      const auto kind = static_cast<Stream>(st);
      if (kind == Stream::Launch) continue;  // the host thread is not device time
      where[sr.streams[st]] = {static_cast<int>(r), kind == Stream::Compute ? 0 : 1};
    }
  }
  const std::size_t lanes = rows.size() * 2;
  std::vector<Tick> acc(lanes * static_cast<std::size_t>(bins) * static_cast<std::size_t>(nc), 0);
  // a * b / c without overflow for any step length (long double keeps 64 bits of mantissa).
  auto muldiv = [](Tick a, long long b, long long c) {
    return static_cast<long long>(static_cast<long double>(a) * static_cast<long double>(b) / static_cast<long double>(c));
  };
  auto bin_start = [&](long long b) { return static_cast<Tick>(muldiv(makespan, b, bins)); };
  for (sim::TaskId t = 0; t < g.num_tasks(); ++t) {
    const Tick t0 = run.start[t], t1 = run.end[t];
    if (t1 <= t0) continue;
    const int cat = std::min<int>(g.category(t), nc - 1);
    for (sim::ResourceId res : g.resources_of(t)) {
      const auto [row, lane] = where[res];
      if (row < 0) continue;
      const std::size_t base = (static_cast<std::size_t>(row) * 2 + static_cast<std::size_t>(lane)) * static_cast<std::size_t>(bins);
      long long b0 = muldiv(t0, bins, makespan);
      long long b1 = muldiv(t1 - 1, bins, makespan);
      b0 = std::clamp<long long>(b0, 0, bins - 1);
      b1 = std::clamp<long long>(b1, 0, bins - 1);
      for (long long b = b0; b <= b1; ++b) {
        const Tick ov = std::min(t1, bin_start(b + 1)) - std::max(t0, bin_start(b));
        if (ov > 0) acc[(base + static_cast<std::size_t>(b)) * static_cast<std::size_t>(nc) + static_cast<std::size_t>(cat)] += ov;
      }
    }
  }

  const double label_w = 100, right = 20, plot_w = 960, W = label_w + plot_w + right;
  const double px = plot_w / bins;
  const double lane_h[2] = {13, 8};
  const double row_h = lane_h[0] + lane_h[1] + 8, top = 8;
  const double plot_h = static_cast<double>(rows.size()) * row_h;
  std::vector<bool> used(static_cast<std::size_t>(nc), false);
  std::string body;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const double y_row = top + static_cast<double>(r) * row_h;
    const auto& sr = ranks[rows[r]];
    body += text(label_w - 8, y_row + lane_h[0] - 2,
                 multi_per_stage ? fmt::format("stage {} r{}", sr.stage, sr.global_rank) : fmt::format("stage {}", sr.stage),
                 "end");
    for (int lane = 0; lane < 2; ++lane) {
      const double y = y_row + (lane == 0 ? 0 : lane_h[0] + 1);
      body += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"{}\"/>\n", f1(label_w), f1(y), f1(plot_w),
                          f1(lane_h[lane]), lane == 0 ? "idle" : "idle2");
      const std::size_t base = (r * 2 + static_cast<std::size_t>(lane)) * static_cast<std::size_t>(bins);
      int run_cat = -1, run_start = 0;
      auto flush = [&](int end_bin) {
        if (run_cat < 0) return;
        used[static_cast<std::size_t>(run_cat)] = true;
        body += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"k{}\"/>\n",
                            fmt::format("{:.2f}", label_w + run_start * px), f1(y),
                            fmt::format("{:.2f}", (end_bin - run_start) * px), f1(lane_h[lane]), run_cat);
      };
      for (int b = 0; b <= bins; ++b) {
        int cat = -1;
        if (b < bins) {
          Tick busy = 0, best = 0;
          for (int c = 0; c < nc; ++c) {
            const Tick v = acc[(base + static_cast<std::size_t>(b)) * static_cast<std::size_t>(nc) + static_cast<std::size_t>(c)];
            busy += v;
            if (v > best) {
              best = v;
              cat = c;
            }
          }
          if (2 * busy < bin_start(b + 1) - bin_start(b)) cat = -1;
        }
        if (cat != run_cat) {
          flush(b);
          run_cat = cat;
          run_start = b;
        }
      }
    }
  }
  // Time axis.
  const double seconds = static_cast<double>(makespan) / static_cast<double>(kTicksPerSecond);
  const bool in_ms = seconds < 2;
  const double unit = in_ms ? 1e-3 : 1;
  const double step = nice_step(seconds / unit, 10);
  const int dec = decimals_for(step);
  std::string axis;
  for (double t = 0; t * unit <= seconds * (1 + 1e-9); t += step) {
    const double x = label_w + t * unit / seconds * plot_w;
    axis += line(x, top, x, top + plot_h, "grid");
    axis += text(x, top + plot_h + 14, fmt::format("{:.{}f}", t, dec), "middle", "small");
  }
  axis += text(label_w + plot_w / 2, top + plot_h + 30,
               fmt::format("time in the step ({}); upper lane: compute stream, lower lane: communication streams",
                           in_ms ? "ms" : "s"),
               "middle", "small");
  std::vector<std::pair<std::string, std::string>> items;
  for (int c = 0; c < nc; ++c)
    if (used[static_cast<std::size_t>(c)]) items.emplace_back(kCatStyles[static_cast<std::size_t>(c)].label, fmt::format("k{}", c));
  items.emplace_back("idle (pipeline bubble, waits)", "idle");
  auto [leg, leg_h] = legend(items, label_w, top + plot_h + 42, plot_w, true);
  const double H = top + plot_h + 42 + leg_h + 4;
  return svg_open("chart-timeline", W, H, "timeline of one training step per simulated rank") + axis + body + leg + "</svg>\n";
}

// ---- sections ------------------------------------------------------------------------------

std::string kv_row(const std::string& k, const std::string& v) {
  return "<tr><td>" + html_escape(k) + "</td><td>" + v + "</td></tr>\n";
}

std::string section_summary(const strategies::Scenario& s, const strategies::Result& r) {
  std::string h = "<section id=\"summary\">\n<h2>Scenario</h2>\n<table class=\"kv\">\n";
  h += kv_row("model", fmt::format("{} ({:.1f}B parameters, {:.1f}B active per token)", html_escape(s.model_name),
                                   r.params_total / 1e9, r.params_active / 1e9));
  h += kv_row("cluster", html_escape(fmt::format("{} x {} ({}, {} per node)", grouped(s.cluster.devices), s.cluster.device.name,
                                                 s.cluster.name, s.cluster.devices_per_node)));
  h += kv_row("training", html_escape(fmt::format("sequence {}, global batch {} ({} tokens per step), {}", s.training.seq_length,
                                                  s.training.global_batch_size, human_count(r.tokens_per_step),
                                                  models::precision_name(s.training.precision))));
  {
    // The plan line without its first line (model and cluster, in the rows above).
    const std::string line = format_plan_line(s);
    const auto nl = line.find('\n');
    h += kv_row("plan", "<code>" + html_escape(nl == std::string::npos ? line : line.substr(nl + 1)) + "</code>");
  }
  if (const auto d = s.document.find("description"); d != s.document.end() && d->is_string() && !d->get<std::string>().empty())
    h += kv_row("description", html_escape(d->get<std::string>()));
  h += "</table>\n<h3>Result of the scenario's plan</h3>\n<table class=\"kv\">\n";
  if (!r.feasible) h += kv_row("feasible", "<span class=\"warn\">no: " + html_escape(r.infeasible_reason) + "</span>");
  h += kv_row("step time", fmt::format("{:.3f} s", r.step_time_s));
  if (r.error_band)
    h += kv_row("typical error",
                fmt::format("±{:.0f}% (68% of {} published {}runs predicted within this, each source with device "
                            "parameters fitted on the others)",
                            r.error_band->within_pct, r.error_band->runs,
                            r.error_band->scope == "all" ? "" : r.error_band->scope + " "));
  h += kv_row("throughput", fmt::format("{} tokens/s ({:.1f} per device)", human_count(r.tokens_per_s), r.tokens_per_s_per_device));
  h += kv_row("MFU / HFU", fmt::format("{:.1f}% / {:.1f}% (Megatron's FLOP formula: {:.1f}% MFU; Huawei-style, attention over "
                                       "the full score matrix: {:.1f}%)",
                                       100 * r.mfu, 100 * r.hfu, 100 * r.mfu_megatron, 100 * r.mfu_huawei));
  h += kv_row("model FLOP rate", fmt::format("{:.1f} TFLOP/s per device (peak {:.1f})", r.achieved_tflops_per_device,
                                             r.peak_tflops_per_device));
  h += kv_row("peak memory", fmt::format("{:.1f} of {:.1f} GiB per device{}", gib(r.peak_memory_bytes), gib(r.capacity_bytes),
                                         r.memory_fits ? "" : " <span class=\"warn\">(does not fit)</span>"));
  h += kv_row("communication hidden", fmt::format("{:.1f}% of {:.3f} s per device", 100 * r.comm_overlap_fraction,
                                                  r.comm_seconds_per_device));
  if (s.model.is_moe()) {
    const auto& el = r.expert_load;
    h += kv_row("expert load", html_escape(fmt::format("{} routing, {} placement: max/mean {:.2f} (worst {:.2f}), imbalance {:.3f}",
                                                       el.routing, el.placement, el.max_over_mean, el.max_over_mean_worst,
                                                       el.imbalance_score)));
  }
  h += "</table>\n</section>\n";
  return h;
}

std::string section_plans(const HtmlReportInput& in) {
  const auto& s = *in.scenario;
  std::string h = "<section id=\"plans\">\n<h2>Best plans</h2>\n";
  if (in.search == nullptr) return h + "<p class=\"note\">The strategy search was not run for this report.</p>\n</section>\n";
  const auto& r = *in.search;
  h += fmt::format("<p class=\"note\">Search space of {} plans: {} divide, {} fit in memory by the screening estimate, {} "
                   "event-simulated; ranked by {}.</p>\n",
                   grouped(r.space_size), grouped(static_cast<double>(r.valid)), grouped(static_cast<double>(r.screened_fit)),
                   r.simulated + r.resumed, strategies::objective_name(r.objective));
  if (r.error_band)
    h += fmt::format("<p class=\"note\">Step times are typically within ±{:.0f}% (68% of {} published {}runs predicted "
                     "within this, each source with device parameters fitted on the others); differences between plans "
                     "smaller than that are still ranked by the same model.</p>\n",
                     r.error_band->within_pct, r.error_band->runs,
                     r.error_band->scope == "all" ? "" : html_escape(r.error_band->scope) + " ");
  if (r.ranked.empty()) return h + "<p class=\"warn\">No simulated plan fits in memory.</p>\n</section>\n";
  h += "<table>\n<tr><th class=\"n\">rank</th><th>plan</th><th class=\"n\">tokens/s</th><th class=\"n\">MFU</th>"
       "<th class=\"n\">step s</th><th class=\"n\">free GiB</th><th>bottleneck</th></tr>\n";
  for (std::size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < in.top; ++i) {
    const auto& p = r.ranked[i];
    h += fmt::format("<tr{}><td class=\"n\">{}</td><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{:.1f}%</td>"
                     "<td class=\"n\">{:.3f}</td><td class=\"n\">{:.1f}</td><td>{}</td></tr>\n",
                     i == 0 ? " class=\"hl\"" : "", i + 1, html_escape(short_plan(p.plan, s.model)), grouped(p.tokens_per_s),
                     100 * p.mfu, p.step_time_s, gib(p.headroom_bytes), html_escape(p.bottleneck));
  }
  h += "</table>\n<p class=\"note\">The best plan as a <code>parallelism</code> section:</p>\n<pre>" +
       html_escape(r.ranked.front().plan_json.dump()) + "</pre>\n</section>\n";
  return h;
}

/// A candidate's label: its config keys and values.
std::string candidate_label(const strategies::ModelCandidate& c) {
  std::string t;
  for (const auto& [k, v] : c.overrides.items()) t += (t.empty() ? "" : ", ") + k + " " + v.dump();
  return t;
}

/// Tokens per second of each candidate model's best plan, best first (a linear axis from 0).
std::string chart_architecture(const strategies::ModelSearchReport& r) {
  std::vector<const strategies::ModelCandidate*> rows;
  for (const auto& c : r.candidates)
    if (c.best) rows.push_back(&c);
  std::size_t longest = 0;
  for (const auto* c : rows) longest = std::max(longest, candidate_label(*c).size());
  const double W = 1000, label_w = std::clamp(16 + 6.6 * static_cast<double>(longest), 200.0, 520.0), right = 150;
  const double plot_w = W - label_w - right, row_h = 22, gap = 9, top = 8;
  double xmax = 0;
  for (const auto* c : rows) xmax = std::max(xmax, c->best->tokens_per_s);
  const double step = nice_step(std::max(xmax, 1.0), 6);
  const double axis_max = std::max(step, std::ceil(xmax / step - 1e-9) * step);
  const double sx = plot_w / axis_max;
  const double plot_h = static_cast<double>(rows.size()) * (row_h + gap);
  const double H = top + plot_h + 40;
  std::string s = svg_open("chart-architecture", W, H, "tokens per second of each candidate model's best plan");
  for (double t = 0; t <= axis_max + step * 1e-6; t += step) {
    const double x = label_w + t * sx;
    s += line(x, top, x, top + plot_h, "grid");
    s += text(x, top + plot_h + 15, tokens_text(t), "middle", "small");
  }
  s += text(label_w + plot_w / 2, top + plot_h + 31, "tokens per second (whole cluster), best plan of each model", "middle",
            "small");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& c = *rows[i];
    const double y = top + static_cast<double>(i) * (row_h + gap);
    const double w = c.best->tokens_per_s * sx;
    s += text(label_w - 8, y + row_h / 2 + 4, candidate_label(c), "end");
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" class=\"{}\"><title>{}: {} tokens/s, "
                     "{:.1f}B total / {:.1f}B active parameters</title></rect>\n",
                     f1(label_w), f1(y), w, f1(row_h), i == 0 ? "k0" : "k1",
                     html_escape(candidate_label(c)), grouped(c.best->tokens_per_s), c.total_params / 1e9,
                     c.active_params / 1e9);
    s += text(label_w + w + 5, y + row_h / 2 + 4,
              fmt::format("{} ({:.1f}B active)", tokens_text(c.best->tokens_per_s), c.active_params / 1e9), "start", "small");
  }
  s += line(label_w, top, label_w, top + plot_h, "axis");
  s += "</svg>\n";
  return s;
}

std::string section_architecture(const strategies::Scenario& s, const strategies::ModelSearchReport& r) {
  std::string h = "<section id=\"architecture\">\n<h2>Model architecture candidates</h2>\n";
  h += fmt::format("<p class=\"note\">{} candidate models from the scenario's <code>model_search</code>, each searched for "
                   "its best parallel plan on {} x {}. Throughput alone favours models with fewer active parameters per "
                   "token; compare like with like (an <code>active_params</code> range).</p>\n",
                   r.candidates.size(), grouped(s.cluster.devices), html_escape(s.cluster.device.name));
  h += "<table>\n<tr><th class=\"n\">rank</th><th>model</th><th class=\"n\">total</th><th class=\"n\">active</th>"
       "<th class=\"n\">tokens/s</th><th class=\"n\">MFU</th><th class=\"n\">step s</th><th>best plan</th></tr>\n";
  int rank = 0;
  for (const auto& c : r.candidates) {
    if (c.best)
      h += fmt::format("<tr{}><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{:.1f}B</td><td class=\"n\">{:.1f}B</td>"
                       "<td class=\"n\">{}</td><td class=\"n\">{:.1f}%</td><td class=\"n\">{:.3f}</td><td><code>{}</code></td></tr>\n",
                       rank == 0 ? " class=\"hl\"" : "", rank + 1, html_escape(candidate_label(c)), c.total_params / 1e9,
                       c.active_params / 1e9, grouped(c.best->tokens_per_s), 100 * c.best->mfu, c.best->step_time_s,
                       html_escape(short_plan(c.best->plan, s.model)));
    else
      h += fmt::format("<tr><td class=\"n\">-</td><td>{}</td><td class=\"n\">{:.1f}B</td><td class=\"n\">{:.1f}B</td>"
                       "<td colspan=\"4\">{}</td></tr>\n",
                       html_escape(candidate_label(c)), c.total_params / 1e9, c.active_params / 1e9, html_escape(c.skipped));
    if (c.best) ++rank;
  }
  h += "</table>\n";
  if (rank > 0)
    h += figure(chart_architecture(r), "Tokens per second of each candidate's best plan (bars from zero; the best "
                                       "highlighted), with its active parameters per token.");
  return h + "</section>\n";
}

std::string section_capacity(const strategies::Scenario& s, const strategies::CapacityReport& cap) {
  std::string h = "<section id=\"capacity\">\n<h2>Capacity planning</h2>\n";
  const std::string budget = tokens_text(cap.train_tokens);
  h += fmt::format("<p>Token budget <b>{}</b> tokens{}; global batch {}. For each cluster size the strategy search "
                   "picks the best plan.</p>\n",
                   budget,
                   cap.deadline_s > 0 ? fmt::format(", deadline <b>{:.1f} days</b>", cap.deadline_s / strategies::kSecondsPerDay)
                                      : std::string(),
                   cap.batch == strategies::BatchScaling::Fixed
                       ? fmt::format("fixed at {} sequences", s.training.global_batch_size)
                       : std::string("scaled with the devices"));
  auto describe = [&](const strategies::CapacityPoint& p) {
    return fmt::format("<b>{} devices</b> with <code>{}</code>: {} tokens/s, MFU {:.1f}%, <b>{:.1f} days</b>, {} device-hours",
                       grouped(p.devices), html_escape(short_plan(p.best.plan, s.model)), human_count(p.tokens_per_s), 100 * p.mfu,
                       p.days, human_count(p.device_hours));
  };
  if (cap.deadline_s > 0) {
    if (cap.answer) h += "<p class=\"ok\">Smallest cluster meeting the deadline: " + describe(cap.points[*cap.answer]) + ".</p>\n";
    else if (cap.fastest)
      h += "<p class=\"warn\">No candidate size meets the deadline. Fastest: " + describe(cap.points[*cap.fastest]) + ".</p>\n";
    else h += "<p class=\"warn\">No candidate size has a plan that fits.</p>\n";
  } else if (cap.fastest) {
    if (cap.cheapest == cap.fastest) {
      h += "<p>Fastest and fewest device-hours: " + describe(cap.points[*cap.fastest]) + ".</p>\n";
    } else {
      h += "<p>Fastest: " + describe(cap.points[*cap.fastest]) + ".</p>\n";
      if (cap.cheapest) h += "<p>Fewest device-hours: " + describe(cap.points[*cap.cheapest]) + ".</p>\n";
    }
  }
  h += "<table>\n<tr><th class=\"n\">devices</th><th class=\"n\">batch</th><th>best plan</th><th class=\"n\">tokens/s</th>"
       "<th class=\"n\">MFU</th><th class=\"n\">step s</th><th class=\"n\">days</th><th class=\"n\">device-hours</th>";
  if (cap.deadline_s > 0) h += "<th>deadline</th>";
  h += "</tr>\n";
  for (std::size_t i = 0; i < cap.points.size(); ++i) {
    const auto& p = cap.points[i];
    const bool hl = cap.answer && *cap.answer == i;
    if (!p.feasible) {
      h += fmt::format("<tr class=\"bad\"><td class=\"n\">{}</td><td class=\"n\">{}</td><td colspan=\"{}\">{}</td></tr>\n",
                       grouped(p.devices), p.global_batch_size, cap.deadline_s > 0 ? 7 : 6, html_escape(p.reason));
      continue;
    }
    h += fmt::format("<tr{}><td class=\"n\">{}</td><td class=\"n\">{}</td><td><code>{}</code></td><td class=\"n\">{}</td>"
                     "<td class=\"n\">{:.1f}%</td><td class=\"n\">{:.3f}</td><td class=\"n\">{:.1f}</td><td class=\"n\">{}</td>",
                     hl ? " class=\"hl\"" : "", grouped(p.devices), p.global_batch_size,
                     html_escape(short_plan(p.best.plan, s.model)), grouped(p.tokens_per_s), 100 * p.mfu, p.best.step_time_s,
                     p.days, grouped(p.device_hours));
    if (cap.deadline_s > 0) h += std::string("<td>") + (p.meets_deadline ? "meets" : "misses") + "</td>";
    h += "</tr>\n";
  }
  h += "</table>\n<p class=\"note\">days = tokens / (tokens/s) / 86,400; device-hours = devices &times; hours. Convergence per "
       "token is not modelled: the same budget is assumed at every size.</p>\n</section>\n";
  return h;
}

}  // namespace

std::vector<std::string> report_chart_ids(const HtmlReportInput& in) {
  std::vector<std::string> ids{"chart-breakdown", "chart-critical-path", "chart-timeline", "chart-schedule", "chart-memory"};
  if (in.scenario != nullptr && in.scenario->model.is_moe() && in.sim != nullptr &&
      !in.sim->result.expert_load.layer_rank_share.empty() && !expert_load_balanced(in.sim->result.expert_load))
    ids.emplace_back("chart-expert-load");
  if (in.capacity != nullptr && !in.capacity->points.empty()) ids.emplace_back("chart-scaling");
  if (in.models != nullptr &&
      std::any_of(in.models->candidates.begin(), in.models->candidates.end(), [](const auto& c) { return c.best.has_value(); }))
    ids.emplace_back("chart-architecture");
  if (in.sim != nullptr && in.sim->result.stragglers) ids.emplace_back("chart-step-times");
  if (const strategies::CapacityPoint* p = reliability_point(in.capacity); p != nullptr) ids.emplace_back("chart-goodput");
  return ids;
}

std::string render_html_report(const HtmlReportInput& in) {
  const auto& s = *in.scenario;
  const auto& r = in.sim->result;
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<link rel=\"icon\" href=\"data:,\">\n";
  h += "<title>moesim report: " + html_escape(s.model_name) + " on " + html_escape(grouped(s.cluster.devices)) + " x " +
       html_escape(s.cluster.device.name) + "</title>\n<style>" + css() + "</style>\n</head>\n<body>\n";
  h += "<header>\n<h1>moesim report: " + html_escape(s.model_name) + "</h1>\n<p class=\"sub\">" +
       html_escape(fmt::format("{} devices ({}, {}), scenario {}", grouped(s.cluster.devices), s.cluster.device.name,
                               s.cluster.name, s.file)) +
       "</p>\n</header>\n";
  h += section_summary(s, r);
  h += section_plans(in);
  if (in.models != nullptr) h += section_architecture(s, *in.models);

  // Breakdown: the scenario's plan, then the best plans.
  {
    std::vector<Bar> bars;
    bars.push_back({"scenario: " + short_plan(s.plan, s.model), r.breakdown, r.breakdown.total()});
    if (in.search != nullptr)
      for (std::size_t i = 0; i < in.search->ranked.size() && static_cast<int>(i) < in.top; ++i) {
        const auto& p = in.search->ranked[i];
        bars.push_back({fmt::format("#{}: {}", i + 1, short_plan(p.plan, s.model)), p.breakdown, p.breakdown.total()});
      }
    h += "<section id=\"breakdown\">\n<h2>Where the time goes</h2>\n";
    h += figure(chart_breakdown(bars),
                "Step time per device split into compute and the communication, bubble and waits not hidden behind it "
                "(hover a segment for its value).");
    h += "</section>\n";
  }
  {
    const strategies::CriticalPath cp = strategies::summarize_critical_path(*in.sim);
    h += "<section id=\"critical-path\">\n<h2>What gates the step</h2>\n";
    h += figure(chart_critical_path(cp),
                html_escape(fmt::format(
                    "The chain of {} tasks that set the {:.3f} s step, each starting when the one before it ended: the step is "
                    "gated by {}. Speeding up anything off this chain does not shorten the step until another chain becomes "
                    "the longest.",
                    grouped(static_cast<double>(cp.tasks)), cp.step_s, strategies::describe_critical_path(cp))));
    h += "</section>\n";
  }
  {
    std::string note;
    const std::string svg = chart_timeline(*in.sim, std::max(1, in.timeline_max_rows), in.timeline_bins, note);
    h += "<section id=\"timeline\">\n<h2>One step of the scenario's plan</h2>\n";
    h += figure(svg, html_escape(fmt::format(
                         "Every simulated rank's streams over one step ({:.3f} s). Tasks are drawn at {} columns: a column takes "
                         "the colour of the category busiest in it when the lane is busy at least half of it; grey gaps in the "
                         "compute lane are the pipeline bubble and waits. {}",
                         r.step_time_s, std::max(50, in.timeline_bins), note)));
    h += "</section>\n";
  }
  {
    const int stages = std::min(16, s.plan.pp);
    h += "<section id=\"schedule\">\n<h2>Pipeline schedule</h2>\n";
    h += figure(chart_schedule(*in.sim, stages),
                html_escape(fmt::format(
                    "{} on {} stages, {} micro-batches{}: each stage's forward (blue) and backward (orange) passes as they ran, "
                    "numbered by micro-batch{}. The grey before the first backward and after the last forward is the "
                    "pipeline's fill and drain; grey inside the steady state is waiting for another stage, an all-to-all or a "
                    "peer.{}",
                    strategies::schedule_name(s.plan.schedule), s.plan.pp, s.plan.num_microbatches,
                    s.plan.vpp > 1 ? fmt::format(" of {} chunks each", s.plan.vpp) : std::string(),
                    s.plan.fb_overlap ? "; with forward-backward overlap a forward and a backward share the device, so "
                                        "short stretches alternate colours"
                                      : "",
                    s.plan.pp > stages ? fmt::format(" The first {} of {} stages are drawn.", stages, s.plan.pp) : std::string())));
    h += "</section>\n";
  }
  h += "<section id=\"memory\">\n<h2>Memory per pipeline stage</h2>\n";
  h += figure(chart_memory(r), html_escape(fmt::format("Per device, at the activation peak of each stage's schedule; capacity "
                                                       "{:.1f} GiB. Peak {:.1f} GiB{}.",
                                                       gib(r.capacity_bytes), gib(r.peak_memory_bytes),
                                                       r.memory_fits ? "" : ": does not fit")));
  h += "</section>\n";
  if (s.model.is_moe()) {
    h += "<section id=\"expert-load\">\n<h2>Expert load</h2>\n";
    const auto& el = r.expert_load;
    if (el.layer_rank_share.empty()) {
      h += "<p class=\"note\">No per-layer expert load was recorded for this run.</p>\n";
    } else {
      if (expert_load_balanced(el))  // a uniform map says nothing a sentence does not
        h += fmt::format("<p class=\"note\">Routing is balanced{}: every one of the {} expert-parallel ranks receives "
                         "the same share of every MoE layer's tokens, so there is no skew to map and no expert imbalance "
                         "wait. Set <code>moe.routing</code> to <code>zipf</code> or <code>dirichlet</code> to see skew.</p>\n",
                         el.routing == "balanced" ? std::string() : " (" + html_escape(el.routing) + " routing)", el.ep);
      else
        h += figure(chart_expert_load(el),
                    html_escape(fmt::format(
                        "Token copies each expert-parallel rank receives per MoE layer, relative to the mean (white = the mean, "
                        "red above, blue below); {} routing, {} placement. The hottest rank gets {:.2f}x the mean on average "
                        "and {:.2f}x at worst: every rank of the layer waits for it.",
                        el.routing, el.placement, el.max_over_mean, el.max_over_mean_worst)));
    }
    h += "</section>\n";
  }
  h += "<section id=\"scaling\">\n<h2>Scaling with the cluster size</h2>\n";
  if (in.capacity == nullptr || in.capacity->points.empty()) {
    h += "<p class=\"note\">The scaling sweep was not run for this report.</p>\n</section>\n";
  } else {
    h += figure(chart_scaling(*in.capacity),
                "Best plan found by the search at each cluster size (same model, device, cluster preset and training "
                "settings). Left, on log-log axes: a straight line parallel to the dashed one is linear scaling; falling "
                "below it is the efficiency lost at scale. Right: MFU, flat under linear scaling.");
    h += "</section>\n";
    h += section_capacity(s, *in.capacity);
  }
  h += section_reliability(r, in.capacity);
  h += "<footer>\n" +
       html_escape(fmt::format("moesim {}; seed {}; {} fidelity; {} simulated ranks, {} tasks, {} events.", strategies::kVersion,
                               r.seed, r.fidelity, r.ranks_simulated, r.tasks, r.events));
  if (!in.wall_time_note.empty()) h += " " + html_escape(in.wall_time_note);
  h += "\n</footer>\n</body>\n</html>\n";
  return h;
}

}  // namespace moesim::tools
