#pragma once
// Number formats and SVG primitives the HTML report's charts are drawn with.
//
//   std::string s = html::svg_open("chart-x", 1000, 300, "what the chart shows");
//   s += html::text(10, 20, "label") + html::line(0, 0, 100, 0, "axis") + "</svg>\n";

#include <string>
#include <utility>
#include <vector>

namespace moesim::tools::html {

double gib(double bytes);
/// A token count with a unit: "2.17M", "1.5B", "10T".
std::string tokens_text(double x);
/// Thousands separators: 1234567 -> "1,234,567".
std::string grouped(double x);
/// One decimal, for SVG coordinates.
std::string f1(double x);
/// Round axis steps (1, 2, 5 x 10^k) giving about `target` ticks up to `max`.
double nice_step(double max, int target);
/// Decimals that print an axis step exactly.
int decimals_for(double step);
/// A y-axis from zero to a round value above `vmax` (about `ticks` steps): its scale in pixels
/// per unit and its grid lines with labels ("12.5" + `unit`) left of `left`.
struct ZeroAxis {
  double step = 1, max = 1, px_per_unit = 1;
  std::string grid;
};
ZeroAxis zero_axis(double vmax, int ticks, double left, double top, double plot_w, double plot_h,
                   const std::string& unit = "");
std::string svg_open(const std::string& id, double w, double h, const std::string& label);
std::string text(double x, double y, const std::string& s, const char* anchor = "start", const char* cls = nullptr);
std::string line(double x1, double y1, double x2, double y2, const char* cls);
/// A legend laid out left to right, wrapping at `width`. Returns the SVG and the height used.
std::pair<std::string, double> legend(const std::vector<std::pair<std::string, std::string>>& items, double x0,
                                      double y0, double width, bool classes);
std::string figure(const std::string& svg, const std::string& caption);

}  // namespace moesim::tools::html
