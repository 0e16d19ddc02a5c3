#include "moesim/sim/units.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <string>

namespace moesim {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

struct Prefix {
  std::string_view text;
  double factor;
};

// Longest prefixes first so "Gi" wins over "G".
constexpr std::array<Prefix, 11> kPrefixes{{
    {"Ki", 1024.0},
    {"Mi", 1024.0 * 1024.0},
    {"Gi", 1024.0 * 1024.0 * 1024.0},
    {"Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0},
    {"k", 1e3},
    {"K", 1e3},
    {"M", 1e6},
    {"G", 1e9},
    {"T", 1e12},
    {"P", 1e15},
    {"", 1.0},
}};

struct Unit {
  std::string_view text;
  Dimension dim;
  double factor;
  bool allow_prefix;
};

// Units after the prefix. Order matters only for readability; matching is exact.
constexpr std::array<Unit, 19> kUnits{{
    {"B/s", Dimension::BytesPerSecond, 1.0, true},
    {"Bps", Dimension::BytesPerSecond, 1.0, true},
    {"bps", Dimension::BytesPerSecond, 0.125, true},
    {"bit/s", Dimension::BytesPerSecond, 0.125, true},
    {"b/s", Dimension::BytesPerSecond, 0.125, true},
    {"FLOPS", Dimension::FlopsPerSecond, 1.0, true},
    {"FLOP/s", Dimension::FlopsPerSecond, 1.0, true},
    {"flops", Dimension::FlopsPerSecond, 1.0, true},
    {"B", Dimension::Bytes, 1.0, true},
    {"b", Dimension::Bytes, 0.125, true},
    {"bit", Dimension::Bytes, 0.125, true},
    {"s", Dimension::Seconds, 1.0, false},
    {"ms", Dimension::Seconds, 1e-3, false},
    {"us", Dimension::Seconds, 1e-6, false},
    {"ns", Dimension::Seconds, 1e-9, false},
    {"ps", Dimension::Seconds, 1e-12, false},
    {"min", Dimension::Seconds, 60.0, false},
    {"h", Dimension::Seconds, 3600.0, false},
    {"d", Dimension::Seconds, 86400.0, false},
}};

}  // namespace

std::optional<ParsedQuantity> parse_quantity(std::string_view text) {
  text = trim(text);
  if (text.empty()) return std::nullopt;
  // Number: digits, sign, dot, exponent.
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    const bool exp_sign = (c == '+' || c == '-') && i > 0 && (text[i - 1] == 'e' || text[i - 1] == 'E');
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.' || (i == 0 && (c == '-' || c == '+')) ||
        exp_sign) {
      ++i;
      continue;
    }
    if ((c == 'e' || c == 'E') && i + 1 < text.size() &&
        (std::isdigit(static_cast<unsigned char>(text[i + 1])) || text[i + 1] == '-' || text[i + 1] == '+')) {
      ++i;
      continue;
    }
    break;
  }
  if (i == 0) return std::nullopt;
  const std::string number(text.substr(0, i));
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) return std::nullopt;
  const std::string_view rest = trim(text.substr(i));
  if (rest.empty()) return ParsedQuantity{v, Dimension::Dimensionless};
  for (const Unit& u : kUnits) {
    if (!u.allow_prefix) {
      if (rest == u.text) return ParsedQuantity{v * u.factor, u.dim};
      continue;
    }
    for (const Prefix& p : kPrefixes) {
      if (rest.size() == p.text.size() + u.text.size() && rest.substr(0, p.text.size()) == p.text &&
          rest.substr(p.text.size()) == u.text) {
        // Binary prefixes make sense for sizes only.
        if (p.text.size() == 2 && u.dim != Dimension::Bytes) continue;
        return ParsedQuantity{v * p.factor * u.factor, u.dim};
      }
    }
  }
  return std::nullopt;
}

const char* dimension_name(Dimension d) {
  switch (d) {
    case Dimension::Seconds: return "a duration (e.g. \"1.5us\")";
    case Dimension::Bytes: return "a size (e.g. \"64GiB\")";
    case Dimension::BytesPerSecond: return "a bandwidth (e.g. \"56GB/s\" or \"200Gbps\")";
    case Dimension::FlopsPerSecond: return "a compute rate (e.g. \"353.8TFLOPS\")";
    case Dimension::Dimensionless: return "a plain number";
  }
  return "?";
}

std::string format_seconds(double s) {
  char buf[64];
  const double a = s < 0 ? -s : s;
  if (a >= 1.0 || a == 0.0) std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (a >= 1e-3) std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  else if (a >= 1e-6) std::snprintf(buf, sizeof buf, "%.3f us", s * 1e6);
  else std::snprintf(buf, sizeof buf, "%.1f ns", s * 1e9);
  return buf;
}

std::string format_bytes(double b) {
  char buf[64];
  const double a = b < 0 ? -b : b;
  if (a >= 1024.0 * 1024.0 * 1024.0) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  else if (a >= 1024.0 * 1024.0) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024.0));
  else if (a >= 1024.0) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

}  // namespace moesim
