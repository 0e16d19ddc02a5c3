#include "documents.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "moesim/sim/random.hpp"

namespace moesim::strategies::lowering {

namespace {

/// Attention work of each of `n` sequences: documents of lognormal length fill the sequences
/// back to back (a document cut at a sequence's end continues in the next).
std::vector<double> sequence_work(const DocumentSpec& ds, int n, double seq, std::uint64_t seed) {
  Rng rng = Rng::stream(seed, "documents");
  const double mu = std::log(ds.mean_tokens) - 0.5 * ds.sigma * ds.sigma;
  std::vector<double> work(static_cast<std::size_t>(n), 0.0);
  double carry = 0;
  for (int i = 0; i < n; ++i) {
    double room = seq, w = 0;
    while (room > 0) {
      double len = carry > 0 ? carry : std::max(1.0, std::round(std::exp(mu + ds.sigma * rng.normal())));
      carry = 0;
      if (len > room) {
        carry = len - room;
        len = room;
      }
      w += len * len;
      room -= len;
    }
    work[i] = w / (seq * seq);
  }
  return work;
}

/// Sequences to data-parallel ranks: in order, or, reordered, longest-work-first onto the
/// least-loaded rank with room.
std::vector<std::vector<double>> sequences_to_ranks(const std::vector<double>& work, bool reorder, int dp, int per_rank_n) {
  const int n = static_cast<int>(work.size());
  std::vector<std::vector<double>> per_rank(static_cast<std::size_t>(dp));
  if (!reorder) {
    for (int i = 0; i < n; ++i) per_rank[i / per_rank_n].push_back(work[i]);
    return per_rank;
  }
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return work[a] > work[b]; });
  std::vector<double> sum(static_cast<std::size_t>(dp), 0.0);
  for (int i : order) {
    int best = -1;
    for (int r = 0; r < dp; ++r)
      if (static_cast<int>(per_rank[r].size()) < per_rank_n && (best < 0 || sum[r] < sum[best])) best = r;
    per_rank[best].push_back(work[i]);
    sum[best] += work[i];
  }
  return per_rank;
}

/// One rank's sequences onto its micro-batches (reordered: longest first onto the lightest).
std::vector<double> sequences_to_microbatches(const std::vector<double>& seqs, bool reorder, int m, int mbs) {
  std::vector<double> mb(static_cast<std::size_t>(m), 0.0);
  if (!reorder) {
    for (std::size_t j = 0; j < seqs.size(); ++j) mb[j / mbs] += seqs[j] / mbs;
    return mb;
  }
  std::vector<int> cnt(static_cast<std::size_t>(m), 0);
  for (double w : seqs) {  // already longest first
    int best = -1;
    for (int k = 0; k < m; ++k)
      if (cnt[k] < mbs && (best < 0 || mb[k] < mb[best])) best = k;
    mb[best] += w / mbs;
    ++cnt[best];
  }
  return mb;
}

}  // namespace

DocumentWork sample_documents(const DocumentSpec& ds, int dp, int m, int mbs, long long seq_length,
                              std::uint64_t seed) {
  const int n = dp * m * mbs;  // sequences of one step
  const std::vector<double> work = sequence_work(ds, n, static_cast<double>(seq_length), seed);
  std::vector<std::vector<double>> per_rank = sequences_to_ranks(work, ds.reorder, dp, m * mbs);
  std::vector<std::pair<double, std::vector<double>>> ranks;  // (total, per micro-batch factor)
  for (auto& seqs : per_rank) {
    std::vector<double> mb = sequences_to_microbatches(seqs, ds.reorder, m, mbs);
    ranks.emplace_back(std::accumulate(mb.begin(), mb.end(), 0.0), std::move(mb));
  }
  // The step waits for the slowest data-parallel ranks at the gradient reduction: simulate those.
  std::stable_sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  double mean = 0;
  for (const auto& r : ranks) mean += r.first / dp;
  DocumentWork out;
  out.max_over_mean = mean > 0 ? ranks.front().first / mean : 1.0;
  out.mean = mean / m;
  for (auto& r : ranks) out.factor.push_back(std::move(r.second));
  return out;
}

}  // namespace moesim::strategies::lowering
