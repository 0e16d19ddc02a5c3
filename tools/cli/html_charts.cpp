// The HTML report's data charts (html_charts.hpp).
#include "html_charts.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "html_svg.hpp"
#include "moesim/strategies/lower/lower.hpp"
#include "report.hpp"

namespace moesim::tools::html {

std::string chart_memory(const strategies::Result& r) {
  const auto& st = r.stages;
  const double W = 1000, left = 60, right = 150, plot_w = W - left - right, plot_h = 300, top = 12;
  double ymax = r.capacity_bytes;
  for (const auto& s : st) ymax = std::max(ymax, s.memory.total());
  ymax = gib(ymax);
  const ZeroAxis axis = zero_axis(ymax, 8, left, top, plot_w, plot_h);
  const double sy = axis.px_per_unit;
  const double slot = plot_w / std::max<double>(1, static_cast<double>(st.size()));
  const double bw = std::min(42.0, slot * 0.72);
  std::string s = axis.grid;
  const int label_every = st.size() > 32 ? static_cast<int>((st.size() + 31) / 32) : 1;
  for (std::size_t i = 0; i < st.size(); ++i) {
    const double x = left + slot * static_cast<double>(i) + (slot - bw) / 2;
    double y = top + plot_h;
    for (std::size_t k = 0; k < kMemParts.size(); ++k) {
      const double v = gib(kMemParts[k].value(st[i].memory));
      if (v <= 0) continue;
      const double h = v * sy;
      y -= h;
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"m{}\"><title>stage {}: {} {:.2f} GiB</title></rect>\n",
                       f1(x), fmt::format("{:.2f}", y), f1(bw), fmt::format("{:.2f}", h), k, st[i].stage,
                       kMemParts[k].label, v);
    }
    if (static_cast<int>(i) % label_every == 0)
      s += text(x + bw / 2, top + plot_h + 14, std::to_string(st[i].stage), "middle", "small");
  }
  const double cy = top + plot_h - gib(r.capacity_bytes) * sy;
  s += line(left, cy, left + plot_w, cy, "cap");
  s += text(left + plot_w + 6, cy + 4, fmt::format("capacity {:.1f} GiB", gib(r.capacity_bytes)), "start", "small");
  s += line(left, top, left, top + plot_h, "axis");
  s += line(left, top + plot_h, left + plot_w, top + plot_h, "axis");
  s += text(left + plot_w / 2, top + plot_h + 30, "pipeline stage", "middle", "small");
  s += fmt::format("<text x=\"14\" y=\"{}\" class=\"small\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">GiB per device</text>\n",
                   f1(top + plot_h / 2), f1(top + plot_h / 2));
  std::vector<std::pair<std::string, std::string>> items;
  for (const auto& p : kMemParts) items.emplace_back(p.label, p.color);
  auto [leg, leg_h] = legend(items, left, top + plot_h + 42, plot_w + right - 20, false);
  const double H = top + plot_h + 42 + leg_h + 4;
  return svg_open("chart-memory", W, H, "memory per pipeline stage against device capacity") + s + leg + "</svg>\n";
}

std::string heat_color(double ratio, double rmax) {
  // Diverging: blue below the balanced share, white at it, red above (up to rmax).
  auto mix = [](int a, int b, double t) { return static_cast<int>(std::lround(a + (b - a) * std::clamp(t, 0.0, 1.0))); };
  int r = 255, g = 255, b = 255;
  if (ratio < 1) {
    const double t = 1 - ratio;
    r = mix(255, 44, t), g = mix(255, 123, t), b = mix(255, 182, t);
  } else if (ratio > 1) {
    const double t = (ratio - 1) / std::max(1e-9, rmax - 1);
    r = mix(255, 215, t), g = mix(255, 25, t), b = mix(255, 28, t);
  }
  return fmt::format("#{:02x}{:02x}{:02x}", r, g, b);
}

bool expert_load_balanced(const strategies::ExpertLoad& el) {
  for (const auto& row : el.layer_rank_share)
    for (double share : row)
      if (std::abs(share * static_cast<double>(row.size()) - 1) >= 1e-6) return false;
  return true;
}

std::string chart_expert_load(const strategies::ExpertLoad& el) {
  const auto& m = el.layer_rank_share;
  const std::size_t L = m.size();
  std::size_t R = 0;
  for (const auto& row : m) R = std::max(R, row.size());
  double rmax = 2;
  for (const auto& row : m)
    for (double share : row) rmax = std::max(rmax, share * static_cast<double>(row.size()));
  const bool balanced = expert_load_balanced(el);
  const double left = 80, right = 130, W = 1000, top = 10;
  const double plot_w = std::min(W - left - right, 28.0 * static_cast<double>(std::max<std::size_t>(R, 1)));
  const double cw = plot_w / static_cast<double>(std::max<std::size_t>(R, 1));
  // Uniform maps (balanced routing) are drawn short: there is nothing to read in them.
  const double ch = std::clamp((balanced ? 240.0 : 600.0) / static_cast<double>(std::max<std::size_t>(L, 1)), 3.0, 14.0);
  const double plot_h = ch * static_cast<double>(L);
  std::string s;
  for (std::size_t l = 0; l < L; ++l) {
    for (std::size_t k = 0; k < m[l].size(); ++k) {
      const double ratio = m[l][k] * static_cast<double>(m[l].size());
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>MoE layer {}, EP rank {}: {:.2f}x the mean</title></rect>\n",
                       fmt::format("{:.2f}", left + cw * static_cast<double>(k)), fmt::format("{:.2f}", top + ch * static_cast<double>(l)),
                       fmt::format("{:.2f}", cw), fmt::format("{:.2f}", ch), heat_color(ratio, rmax), l, k, ratio);
    }
  }
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n", f1(left), f1(top),
                   fmt::format("{:.2f}", plot_w), fmt::format("{:.2f}", plot_h));
  const std::size_t every_l = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(12.0 / ch)));
  for (std::size_t l = 0; l < L; l += every_l)
    s += text(left - 6, top + ch * (static_cast<double>(l) + 0.5) + 3.5, std::to_string(l), "end", "small");
  const std::size_t every_r = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(22.0 / cw)));
  for (std::size_t k = 0; k < R; k += every_r)
    s += text(left + cw * (static_cast<double>(k) + 0.5), top + plot_h + 13, std::to_string(k), "middle", "small");
  s += text(left + plot_w / 2, top + plot_h + 28, "expert-parallel rank", "middle", "small");
  s += fmt::format("<text x=\"16\" y=\"{}\" class=\"small\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">MoE layer</text>\n",
                   f1(top + plot_h / 2), f1(top + plot_h / 2));
  // Colour scale.
  const double gx = left + plot_w + 30, gh = std::min(200.0, plot_h);
  s += "<defs><linearGradient id=\"hm-scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (int i = 0; i <= 10; ++i) {
    const double ratio = rmax * i / 10.0;
    s += fmt::format("<stop offset=\"{:.2f}\" stop-color=\"{}\"/>", i / 10.0, heat_color(ratio, rmax));
  }
  s += "</linearGradient></defs>\n";
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"{}\" fill=\"url(#hm-scale)\" stroke=\"#999\"/>\n", f1(gx), f1(top),
                   f1(gh));
  s += text(gx + 20, top + 8, fmt::format("{:.1f}x", rmax), "start", "small");
  s += text(gx + 20, top + gh * (1 - 1 / rmax) + 4, "1x (mean)", "start", "small");
  s += text(gx + 20, top + gh, "0", "start", "small");
  s += text(gx - 4, top + gh + 18, "tokens vs mean", "start", "small");
  const double H = top + std::max(plot_h, gh + 20) + 36;
  return svg_open("chart-expert-load", W, H, "expert load heatmap: MoE layers by expert-parallel ranks") + s + "</svg>\n";
}

std::string chart_scaling(const strategies::CapacityReport& cap) {
  // Left: tokens/s on log-log axes, so linear scaling is a straight line of slope one (drawn
  // dashed from the smallest feasible size); right: MFU on a linear axis from zero, where
  // linear scaling is a flat line.
  const double W = 1000, panel_w = 400, plot_h = 240, top = 26, left0 = 70, gap = 110;
  double lo = 1e18, hi = 0, tmin = 1e30, tmax = 0, mmax = 0;
  const strategies::CapacityPoint* first = nullptr;
  for (const auto& p : cap.points) {
    lo = std::min(lo, std::log2(static_cast<double>(p.devices)));
    hi = std::max(hi, std::log2(static_cast<double>(p.devices)));
    if (p.feasible && p.tokens_per_s > 0) {
      tmin = std::min(tmin, p.tokens_per_s);
      tmax = std::max(tmax, p.tokens_per_s);
      mmax = std::max(mmax, 100 * p.mfu);
      if (first == nullptr || p.devices < first->devices) first = &p;
    }
  }
  std::string s;
  auto xpos = [&](double left, double devices) {
    if (hi <= lo) return left + panel_w / 2;
    return left + 20 + (std::log2(devices) - lo) / (hi - lo) * (panel_w - 40);
  };
  auto frame = [&](double left, const std::string& title, const char* xlabel) {
    s += text(left + panel_w / 2, top - 10, title, "middle", "title");
    s += line(left, top, left, top + plot_h, "axis");
    s += line(left, top + plot_h, left + panel_w, top + plot_h, "axis");
    for (const auto& p : cap.points)
      s += text(xpos(left, p.devices), top + plot_h + 14, grouped(p.devices), "middle", "small");
    s += text(left + panel_w / 2, top + plot_h + 30, xlabel, "middle", "small");
  };
  auto cross = [&](double x) {
    const double y = top + plot_h - 6;
    s += line(x - 5, y - 5, x + 5, y + 5, "bad") + line(x - 5, y + 5, x + 5, y - 5, "bad");
  };
  // Tokens/s, log10 axis over whole decades around the values and the ideal line's end.
  {
    const double left = left0;
    frame(left, "throughput (tokens/s, log scale)", "devices (log scale)");
    double ideal_max = tmax;
    if (first != nullptr) ideal_max = std::max(tmax, first->tokens_per_s * std::exp2(hi) / first->devices);
    const double d_lo = tmin < 1e30 ? std::floor(std::log10(tmin)) : 0, d_hi = std::max(d_lo + 1, std::ceil(std::log10(ideal_max)));
    auto ypos = [&](double v) { return top + plot_h - (std::log10(v) - d_lo) / (d_hi - d_lo) * plot_h; };
    for (double d = d_lo; d <= d_hi + 1e-9; d += 1) {
      s += line(left, ypos(std::pow(10, d)), left + panel_w, ypos(std::pow(10, d)), "grid");
      s += text(left - 6, ypos(std::pow(10, d)) + 4, human_count(std::pow(10, d)), "end", "small");
      if (d < d_hi)
        for (const int k : {2, 5})  // labelled ticks at 2 and 5 x the decade
          s += text(left - 6, ypos(k * std::pow(10, d)) + 4, human_count(k * std::pow(10, d)), "end", "small");
    }
    if (first != nullptr) {
      const double x0 = xpos(left, first->devices), y0 = ypos(first->tokens_per_s);
      const double x1 = xpos(left, std::exp2(hi)), y1 = ypos(first->tokens_per_s * std::exp2(hi) / first->devices);
      s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"ideal\"><title>linear scaling from {} devices</title></line>\n",
                       f1(x0), f1(y0), f1(x1), f1(y1), first->devices);
    }
    std::string poly;
    for (const auto& p : cap.points) {
      const double x = xpos(left, p.devices);
      if (!p.feasible || p.tokens_per_s <= 0) {
        cross(x);
        continue;
      }
      const double y = ypos(p.tokens_per_s);
      poly += fmt::format("{},{} ", f1(x), f1(y));
      s += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"4\" class=\"dot0\"><title>{} devices: {} tokens/s</title></circle>\n",
                       f1(x), f1(y), p.devices, human_count(p.tokens_per_s));
      if (cap.answer && &p == &cap.points[*cap.answer])
        s += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"8\" class=\"ring\"/>\n", f1(x), f1(y));
    }
    if (!poly.empty()) {
      poly.pop_back();
      s += fmt::format("<polyline points=\"{}\" class=\"line0\"/>\n", poly);
    }
  }
  // MFU, linear from zero.
  {
    const double left = left0 + panel_w + gap;
    frame(left, "MFU (%)", "devices (log scale)");
    const ZeroAxis axis = zero_axis(std::max(mmax, 1.0), 6, left, top, panel_w, plot_h, "%");
    s += axis.grid;
    std::string poly;
    for (const auto& p : cap.points) {
      const double x = xpos(left, p.devices);
      if (!p.feasible) {
        cross(x);
        continue;
      }
      const double y = top + plot_h - 100 * p.mfu * axis.px_per_unit;
      poly += fmt::format("{},{} ", f1(x), f1(y));
      s += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"4\" class=\"dot1\"><title>{} devices: {:.1f}% MFU</title></circle>\n",
                       f1(x), f1(y), p.devices, 100 * p.mfu);
    }
    if (!poly.empty()) {
      poly.pop_back();
      s += fmt::format("<polyline points=\"{}\" class=\"line1\"/>\n", poly);
    }
  }
  std::string notes = "best plan at each size; dashed: linear scaling from the smallest size; \xc3\x97 = no plan fits";
  if (cap.answer) notes += "; ring = smallest size meeting the deadline";
  s += text(left0, top + plot_h + 50, notes, "start", "small");
  const double H = top + plot_h + 60;
  return svg_open("chart-scaling", W, H, "tokens per second (log-log, with linear scaling) and MFU against cluster size") + s +
         "</svg>\n";
}


namespace {

/// A compute task's pass: forward (0) or backward (1, with recomputation and weight gradients),
/// from its label; -1 for tasks of no micro-batch (optimizer, collectives of the step).
int pass_of(const sim::TaskGraph& g, sim::TaskId t) {
  if (g.ordinal(t) < 0) return -1;
  const std::string& l = g.label_text(g.label(t));
  for (const char* b : {".bwd", ".dgrad", ".wgrad", ".recompute"})
    if (l.find(b) != std::string::npos) return 1;
  return 0;
}

}  // namespace

std::string chart_schedule(const strategies::Simulation& sim, int max_stages) {
  const sim::TaskGraph& g = sim.lowered.graph;
  const sim::RunResult& run = sim.run;
  const double step = std::max<double>(1.0, static_cast<double>(run.makespan));
  const double W = 1000, left = 70, right = 20, top = 8, lane = 18, lane_gap = 4;
  const double plot_w = W - left - right;
  const int bins = 900;
  // The first simulated rank of each stage.
  std::vector<const strategies::SimRank*> rows;
  for (const auto& r : sim.lowered.ranks) {
    if (static_cast<int>(rows.size()) >= max_stages) break;
    if (rows.empty() || rows.back()->stage != r.stage) rows.push_back(&r);
  }
  std::string s;
  const double plot_h = static_cast<double>(rows.size()) * (lane + lane_gap);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double y = top + static_cast<double>(i) * (lane + lane_gap);
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"idle\"/>\n", f1(left), f1(y), f1(plot_w), f1(lane));
    s += text(left - 6, y + lane / 2 + 4, fmt::format("stage {}", rows[i]->stage), "end", "small");
    // A pass runs from its first kernel to its last of a run of kernels in issue order (waits
    // inside it, for an all-to-all or the host, are part of it); the runs are binned, and a bin
    // takes the key covering most of it when runs cover at least half of it.
    std::vector<std::map<std::pair<int, int>, double>> busy(bins);
    auto cover = [&](std::pair<int, int> key, Tick from, Tick to) {
      const double a = static_cast<double>(from) / step * bins, b = static_cast<double>(to) / step * bins;
      for (int k = std::max(0, static_cast<int>(a)); k < std::min(bins, static_cast<int>(std::ceil(b))); ++k)
        busy[k][key] += std::min<double>(b, k + 1) - std::max<double>(a, k);
    };
    std::pair<int, int> cur{-1, -1};
    Tick from = 0, to = 0;
    for (sim::TaskId t : g.stream_order(rows[i]->streams[static_cast<int>(strategies::Stream::Compute)])) {
      const int pass = pass_of(g, t);
      if (pass < 0 || run.end[t] <= run.start[t]) continue;
      const std::pair<int, int> key{g.ordinal(t), pass};
      if (key != cur) {
        if (cur.first >= 0) cover(cur, from, to);
        cur = key;
        from = run.start[t];
      }
      to = run.end[t];
    }
    if (cur.first >= 0) cover(cur, from, to);
    std::vector<std::pair<int, int>> key(bins, {-1, -1});
    for (int k = 0; k < bins; ++k) {
      double total = 0, best = 0;
      for (const auto& [kk, v] : busy[k]) {
        total += v;
        if (v > best) {
          best = v;
          key[k] = kk;
        }
      }
      if (total < 0.5) key[k] = {-1, -1};
    }
    for (int k = 0; k < bins;) {
      int e = k + 1;
      while (e < bins && key[e] == key[k]) ++e;
      if (key[k].first >= 0) {
        const auto [mb, pass] = key[k];
        const double x = left + plot_w * k / bins, w = plot_w * (e - k) / bins;
        s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"{}{}\"><title>stage {}: micro-batch {} {}, "
                         "{:.3f}-{:.3f} s</title></rect>\n",
                         fmt::format("{:.2f}", x), f1(y), fmt::format("{:.2f}", w), f1(lane), pass == 0 ? "sf" : "sb", mb % 2,
                         rows[i]->stage, mb, pass == 0 ? "forward" : "backward", to_seconds(Tick(step * k / bins)).value(),
                         to_seconds(Tick(step * e / bins)).value());
        if (w >= 14) s += text(x + w / 2, y + lane / 2 + 4, std::to_string(mb), "middle", "tiny");
      }
      k = e;
    }
  }
  // Time axis in seconds.
  const double secs = to_seconds(Tick(step)).value();
  const double tick = nice_step(secs, 10);
  for (double t = 0; t <= secs + tick * 1e-6; t += tick) {
    const double x = left + plot_w * t / secs;
    s += line(x, top + plot_h, x, top + plot_h + 4, "axis");
    s += text(x, top + plot_h + 16, fmt::format("{:.{}f}", t, decimals_for(tick)), "middle", "small");
  }
  s += text(left + plot_w / 2, top + plot_h + 32, "time in the step (s)", "middle", "small");
  auto [leg, leg_h] = legend({{"forward (shades alternate by micro-batch; hover for its number)", "#4e79a7"},
                              {"backward, with recomputation and weight gradients", "#e8772e"},
                              {"idle: bubble, waits, exposed communication", "#ececec"}},
                             left, top + plot_h + 42, plot_w, false);
  const double H = top + plot_h + 42 + leg_h + 4;
  return svg_open("chart-schedule", W, H, "pipeline schedule: forward and backward passes per stage over one step") + s + leg +
         "</svg>\n";
}

std::string chart_critical_path(const strategies::CriticalPath& c) {
  const double W = 1000, left = 150, right = 20, top = 8, bar = 26;
  const double plot_w = W - left - right;
  std::string s;
  const auto& names = strategies::category_names();
  auto bar_row = [&](double y, const std::string& title, const auto& parts, auto cls_of, auto label_of) {
    s += text(left - 8, y + bar / 2 + 4, title, "end", "small");
    double x = left;
    for (const auto& part : parts) {
      const double w = c.step_s > 0 ? plot_w * part.second / c.step_s : 0;
      if (w <= 0) continue;
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"{}\"><title>{}: {:.3f} s ({:.1f}% of the "
                       "step)</title></rect>\n",
                       fmt::format("{:.2f}", x), f1(y), fmt::format("{:.2f}", w), f1(bar), cls_of(part), label_of(part),
                       part.second, 100 * part.second / c.step_s);
      if (w >= 60) s += text(x + w / 2, y + bar / 2 + 4, label_of(part), "middle", "inbar");
      x += w;
    }
  };
  auto cat_index = [&](const std::string& n) {
    const auto it = std::find(names.begin(), names.end(), n);
    return static_cast<int>(it - names.begin());
  };
  bar_row(top, "by kind of work", c.by_category,
          [&](const auto& p) { return fmt::format("k{}", cat_index(p.first)); },
          [&](const auto& p) {
            return fmt::format("{} {:.0f}%", strategies::category_words(p.first), 100 * p.second / std::max(1e-12, c.step_s));
          });
  bar_row(top + bar + 12, "by pipeline stage", c.by_stage, [](const auto& p) { return p.first % 2 == 0 ? "st0" : "st1"; },
          [&](const auto& p) { return fmt::format("stage {} {:.0f}%", p.first, 100 * p.second / std::max(1e-12, c.step_s)); });
  const double y_axis = top + 2 * bar + 12;
  for (int k = 0; k <= 10; ++k) {
    const double x = left + plot_w * k / 10;
    s += line(x, y_axis, x, y_axis + 4, "axis");
    s += text(x, y_axis + 16, fmt::format("{}%", 10 * k), "middle", "small");
  }
  s += text(left + plot_w / 2, y_axis + 32, "share of the step time on the critical path", "middle", "small");
  const double H = y_axis + 40;
  return svg_open("chart-critical-path", W, H, "the critical path of the step by kind of work and by pipeline stage") + s +
         "</svg>\n";
}

}  // namespace moesim::tools::html
