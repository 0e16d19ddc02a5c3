// Number formats and SVG primitives of the HTML report (html_svg.hpp).
#include "html_svg.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "html_report.hpp"
#include "report.hpp"

namespace moesim::tools {

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
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

namespace html {

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }


std::string tokens_text(double x) {
  if (x >= 1e12) return fmt::format("{:g}T", std::round(x / 1e10) / 100);
  if (x >= 1e9) return fmt::format("{:g}B", std::round(x / 1e7) / 100);
  return human_count(x);
}

/// Thousands separators: 1234567 -> "1,234,567".
std::string grouped(double x) {
  std::string digits = fmt::format("{:.0f}", std::abs(x));
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (x < 0 ? "-" : "") + out;
}

std::string f1(double x) { return fmt::format("{:.1f}", x); }

/// Round axis steps (1, 2, 5 x 10^k) giving about `target` ticks up to `max`.
double nice_step(double max, int target) {
  if (!(max > 0)) return 1;
  const double raw = max / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
}

int decimals_for(double step) { return std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9))); }

ZeroAxis zero_axis(double vmax, int ticks, double left, double top, double plot_w, double plot_h,
                   const std::string& unit) {
  ZeroAxis a;
  a.step = nice_step(vmax * 1.05, ticks);
  a.max = std::max(a.step, std::ceil(vmax * 1.05 / a.step) * a.step);
  a.px_per_unit = plot_h / a.max;
  const int dec = decimals_for(a.step);
  for (double v = 0; v <= a.max + a.step * 1e-6; v += a.step) {
    const double y = top + plot_h - v * a.px_per_unit;
    a.grid += line(left, y, left + plot_w, y, "grid");
    a.grid += text(left - 6, y + 4, fmt::format("{:.{}f}{}", v, dec, unit), "end", "small");
  }
  return a;
}

std::string svg_open(const std::string& id, double w, double h, const std::string& label) {
  return fmt::format(
      "<svg id=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {:.0f} {:.0f}\" width=\"{:.0f}\" "
      "height=\"{:.0f}\" role=\"img\" aria-label=\"{}\">\n",
      id, w, h, w, h, html_escape(label));
}

std::string text(double x, double y, const std::string& s, const char* anchor, const char* cls) {
  return fmt::format("<text x=\"{}\" y=\"{}\"{}{}>{}</text>\n", f1(x), f1(y),
                     std::string_view(anchor) == "start" ? "" : fmt::format(" text-anchor=\"{}\"", anchor),
                     cls ? fmt::format(" class=\"{}\"", cls) : "", html_escape(s));
}

std::string line(double x1, double y1, double x2, double y2, const char* cls) {
  return fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"{}\"/>\n", f1(x1), f1(y1), f1(x2), f1(y2), cls);
}

/// A legend laid out left to right, wrapping at `width`. Returns the SVG and the height used.
std::pair<std::string, double> legend(const std::vector<std::pair<std::string, std::string>>& items, double x0,
                                      double y0, double width, bool classes) {
  std::string s;
  double x = x0, y = y0;
  for (const auto& [label, style] : items) {
    const double w = 22 + 6.6 * static_cast<double>(label.size()) + 16;
    if (x + w > x0 + width && x > x0) {
      x = x0;
      y += 18;
    }
    if (classes) s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"11\" class=\"{}\"/>\n", f1(x), f1(y), style);
    else s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"11\" fill=\"{}\"/>\n", f1(x), f1(y), style);
    s += text(x + 19, y + 10, label);
    x += w;
  }
  return {s, y - y0 + 18};
}

std::string figure(const std::string& svg, const std::string& caption) {
  return "<figure>\n" + svg + "<figcaption>" + caption + "</figcaption>\n</figure>\n";
}

}  // namespace html
}  // namespace moesim::tools
