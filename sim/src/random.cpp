#include "moesim/sim/random.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace moesim {
namespace {

std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(std::uint64_t seed) {
  std::uint64_t x = seed;
  for (auto& w : s_) w = splitmix64(x);
}

Rng Rng::stream(std::uint64_t seed, std::string_view name) {
  const std::uint64_t h = fnv1a(name);
  return Rng(seed ^ rotl(h, 17) ^ 0x5851f42d4c957f2dULL);
}

std::uint64_t Rng::next() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform();
  while (u1 <= 0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2 * std::numbers::pi * u2);
  has_spare_ = true;
  return r * std::cos(2 * std::numbers::pi * u2);
}

double Rng::gamma(double shape) {
  if (shape <= 0) return 0;
  if (shape < 1) {  // boost: Gamma(a) = Gamma(a + 1) U^(1/a)
    double u = uniform();
    while (u <= 0) u = uniform();
    return gamma(shape + 1) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9 * d);
  while (true) {
    double x, v;
    do {
      x = normal();
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = uniform();
    if (u < 1 - 0.0331 * x * x * x * x) return d * v;
    if (u > 0 && std::log(u) < 0.5 * x * x + d * (1 - v + std::log(v))) return d * v;
  }
}

std::uint64_t Rng::binomial(std::uint64_t n, double p) {
  if (n == 0 || p <= 0) return 0;
  if (p >= 1) return n;
  const double mean = static_cast<double>(n) * p;
  if (n <= 64) {  // exact: count successes
    std::uint64_t k = 0;
    for (std::uint64_t i = 0; i < n; ++i) k += uniform() < p ? 1 : 0;
    return k;
  }
  if (mean < 30 || static_cast<double>(n) * (1 - p) < 30) {
    // Inversion on the smaller side (Poisson-like regime).
    const bool flip = p > 0.5;
    const double q = flip ? 1 - p : p;
    const double lam = static_cast<double>(n) * q;
    double prob = std::exp(static_cast<double>(n) * std::log1p(-q));
    double cdf = prob;
    const double u = uniform();
    std::uint64_t k = 0;
    while (u > cdf && k < n) {
      prob *= (static_cast<double>(n - k) / static_cast<double>(k + 1)) * (q / (1 - q));
      cdf += prob;
      ++k;
      if (k > 50 * static_cast<std::uint64_t>(lam + 10)) break;
    }
    return flip ? n - k : k;
  }
  // Normal approximation with continuity correction (n p (1-p) >= ~30 here).
  const double sd = std::sqrt(mean * (1 - p));
  const double x = std::floor(mean + sd * normal() + 0.5);
  return static_cast<std::uint64_t>(std::clamp(x, 0.0, static_cast<double>(n)));
}

std::vector<std::uint64_t> Rng::multinomial(std::uint64_t n, const std::vector<double>& p) {
  std::vector<std::uint64_t> out(p.size(), 0);
  double rest = 0;
  for (double x : p) rest += std::max(0.0, x);
  std::uint64_t left = n;
  for (std::size_t i = 0; i < p.size() && left > 0; ++i) {
    const double pi = std::max(0.0, p[i]);
    if (i + 1 == p.size() || rest <= 0) {
      out[i] = left;
      break;
    }
    const std::uint64_t k = binomial(left, std::min(1.0, pi / rest));
    out[i] = k;
    left -= k;
    rest -= pi;
  }
  return out;
}

std::vector<double> Rng::dirichlet(std::size_t k, double alpha) {
  std::vector<double> g(k);
  double sum = 0;
  for (auto& x : g) sum += (x = gamma(alpha));
  if (sum <= 0) return std::vector<double>(k, 1.0 / static_cast<double>(k));
  for (auto& x : g) x /= sum;
  return g;
}

std::vector<int> Rng::permutation(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  for (int i = n - 1; i > 0; --i) std::swap(v[i], v[next() % static_cast<std::uint64_t>(i + 1)]);
  return v;
}

}  // namespace moesim
