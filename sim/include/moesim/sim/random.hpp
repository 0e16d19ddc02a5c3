#pragma once
// Deterministic random numbers: one scenario seed, named streams derived from it, and
// distributions written here (the standard library's differ between implementations, which
// would break byte-identical output across machines).
//
//   Rng rng = Rng::stream(seed, "routing/layer12/mb3");   // independent of other streams
//   double u = rng.uniform();                              // [0, 1)
//   std::uint64_t k = rng.binomial(1000, 0.25);
//
// Generator: xoshiro256** seeded through splitmix64 from (seed, FNV-1a of the stream name).

#include <cstdint>
#include <string_view>
#include <vector>

namespace moesim {

/// 64-bit FNV-1a of a byte string: stream names, fingerprints and checksums (not cryptographic).
constexpr std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed);
  /// A stream named `name` under `seed`: the same pair always gives the same numbers.
  static Rng stream(std::uint64_t seed, std::string_view name);

  std::uint64_t next();
  double uniform();                       ///< [0, 1)
  double normal();                        ///< standard normal (Box-Muller)
  double gamma(double shape);             ///< Gamma(shape, 1) (Marsaglia-Tsang)
  std::uint64_t binomial(std::uint64_t n, double p);
  /// Counts of n draws over categories with probabilities p (sums to n).
  std::vector<std::uint64_t> multinomial(std::uint64_t n, const std::vector<double>& p);
  /// A Dirichlet(alpha, ..., alpha) probability vector of size k.
  std::vector<double> dirichlet(std::size_t k, double alpha);
  /// A uniformly random permutation of 0..n-1 (Fisher-Yates).
  std::vector<int> permutation(int n);

 private:
  std::uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace moesim
