#pragma once
// Units: strongly typed physical quantities at API boundaries, and the engine's integer tick.
//
// Quantities keep seconds, bytes, FLOPs and rates apart so that `bytes * bytes` does not
// compile and `Bytes / BytesPerSecond` yields `Seconds`. Engine time is an integer count of
// picoseconds (`Tick`), so event ordering never compares doubles.
//
//   Bytes n = gib(2);                       // 2 GiB
//   Seconds t = n / BytesPerSecond{25e9};   // transfer time at 25 GB/s
//   Tick ticks = to_ticks(t);               // integer picoseconds for the engine
//
// Unit strings in configs ("200Gbps", "56GB/s", "1.5us", "64GiB", "353.8TFLOPS") are parsed
// by `parse_quantity`, which reports which dimension it found so callers can check it.

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace moesim {

template <class Tag>
class Quantity {
 public:
  constexpr Quantity() = default;
  constexpr explicit Quantity(double v) : v_(v) {}
  [[nodiscard]] constexpr double value() const { return v_; }

  constexpr Quantity& operator+=(Quantity o) { v_ += o.v_; return *this; }
  constexpr Quantity& operator-=(Quantity o) { v_ -= o.v_; return *this; }
  friend constexpr Quantity operator+(Quantity a, Quantity b) { return Quantity{a.v_ + b.v_}; }
  friend constexpr Quantity operator-(Quantity a, Quantity b) { return Quantity{a.v_ - b.v_}; }
  friend constexpr Quantity operator*(Quantity a, double k) { return Quantity{a.v_ * k}; }
  friend constexpr Quantity operator*(double k, Quantity a) { return Quantity{a.v_ * k}; }
  friend constexpr Quantity operator/(Quantity a, double k) { return Quantity{a.v_ / k}; }
  friend constexpr double operator/(Quantity a, Quantity b) { return a.v_ / b.v_; }
  friend constexpr auto operator<=>(Quantity a, Quantity b) = default;

 private:
  double v_ = 0.0;
};

struct SecondsTag {};
struct BytesTag {};
struct FlopsTag {};
struct BytesPerSecondTag {};
struct FlopsPerSecondTag {};

using Seconds = Quantity<SecondsTag>;
using Bytes = Quantity<BytesTag>;
using Flops = Quantity<FlopsTag>;
using BytesPerSecond = Quantity<BytesPerSecondTag>;
using FlopsPerSecond = Quantity<FlopsPerSecondTag>;

constexpr Seconds operator/(Bytes n, BytesPerSecond r) { return Seconds{n.value() / r.value()}; }
constexpr Seconds operator/(Flops n, FlopsPerSecond r) { return Seconds{n.value() / r.value()}; }
constexpr Bytes operator*(BytesPerSecond r, Seconds t) { return Bytes{r.value() * t.value()}; }
constexpr Flops operator*(FlopsPerSecond r, Seconds t) { return Flops{r.value() * t.value()}; }

constexpr Bytes gib(double n) { return Bytes{n * 1024.0 * 1024.0 * 1024.0}; }
constexpr Seconds microseconds(double us) { return Seconds{us * 1e-6}; }

// ---- Engine time -------------------------------------------------------------------------

/// Engine time: integer picoseconds. int64 spans ~106 days; the simulator's horizon is a quarter
/// of that, `kMaxTick` (~26.7 days), so that a few horizon-bounded quantities can be added
/// without wrapping. Nothing the engine reports lies beyond it: a duration or a time that would
/// is saturated at `kMaxTick` and the run is reported out of range (never a wrapped, negative
/// time).
using Tick = std::int64_t;
inline constexpr Tick kTicksPerSecond = 1'000'000'000'000;
inline constexpr Tick kMaxTick = std::numeric_limits<Tick>::max() / 4;

/// Rounds to the nearest tick, saturating at kMaxTick (which the engine reports as out of range).
/// Negative or NaN durations are a bug in the caller and become 0 (see `ticks_out_of_range`).
inline Tick to_ticks(Seconds s) {
  const double t = s.value() * static_cast<double>(kTicksPerSecond);
  if (!(t >= 0.0)) return 0;
  if (t >= static_cast<double>(kMaxTick)) return kMaxTick;
  return static_cast<Tick>(std::llround(t));
}
/// Sum of two times in [0, kMaxTick], saturating at kMaxTick instead of wrapping.
inline constexpr Tick add_ticks(Tick a, Tick b) {
  if (a < 0) a = 0;
  if (b < 0) b = 0;
  return a >= kMaxTick || b >= kMaxTick - a ? kMaxTick : a + b;
}
/// A time in [0, kMaxTick] scaled by k >= 0, rounded, saturating at kMaxTick.
inline Tick scale_ticks(Tick t, double k) {
  const double v = static_cast<double>(t) * k;
  if (!(v >= 0.0)) return 0;
  if (v >= static_cast<double>(kMaxTick)) return kMaxTick;
  return static_cast<Tick>(std::llround(v));
}
/// True when a duration or time has reached the horizon (it was saturated).
inline constexpr bool ticks_out_of_range(Tick t) { return t >= kMaxTick || t < 0; }
inline constexpr Seconds to_seconds(Tick t) {
  return Seconds{static_cast<double>(t) / static_cast<double>(kTicksPerSecond)};
}

// ---- Unit strings --------------------------------------------------------------------------

enum class Dimension { Seconds, Bytes, BytesPerSecond, FlopsPerSecond, Dimensionless };

struct ParsedQuantity {
  double value = 0.0;  ///< in SI base units: s, B, B/s, FLOP/s
  Dimension dimension = Dimension::Dimensionless;
};

/// Parses "200Gbps", "56GB/s", "25 GBps", "1.5us", "64GiB", "353.8TFLOPS", "2.5e-6s".
/// Bits ("b", "bps", "bit/s") and bytes ("B", "B/s", "Bps") are distinct; decimal (k, M, G, T, P)
/// and binary (Ki, Mi, Gi, Ti) prefixes are supported. Returns nullopt when it cannot parse.
std::optional<ParsedQuantity> parse_quantity(std::string_view text);

const char* dimension_name(Dimension d);

/// Formats a quantity for humans with an SI prefix: "1.46 s", "64 GiB", "25 GB/s".
std::string format_seconds(double s);
std::string format_bytes(double b);

}  // namespace moesim
