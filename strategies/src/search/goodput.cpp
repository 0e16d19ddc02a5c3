#include "moesim/strategies/search/goodput.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "moesim/models/workload.hpp"
#include "moesim/sim/random.hpp"
#include "moesim/strategies/lower/memory.hpp"

namespace moesim::strategies {

namespace {

/// Exponentially distributed time to the next failure (infinite without failures).
double exponential(Rng& rng, double rate) {
  return rate > 0 ? -std::log(1.0 - rng.uniform()) / rate : std::numeric_limits<double>::infinity();
}

struct Run {
  double wall = 0, blocked = 0, failures = 0;
};

/// One run at checkpoint interval `tau` (training seconds), failures from `rng`.
Run one_run(const GoodputInputs& in, double tau, Rng rng) {
  Run run;
  const double W = in.work_s;
  double pos = 0, durable = 0;  // work done; work safe in a durable checkpoint
  double pending = -1, pending_at = 0;  // an asynchronous checkpoint not yet durable: its work, when
  double next_fail = exponential(rng, in.failure_rate_per_s);
  auto settle = [&](double now) {
    if (pending >= 0 && pending_at <= now) {
      durable = pending;
      pending = -1;
    }
  };
  bool steady = false;  // just after a checkpoint taken in the regular rhythm
  while (pos < W) {
    // Fast-forward whole checkpoint cycles that end before the next failure and the run's end:
    // a cycle is the interval, any wait for the previous checkpoint's persist, and the block.
    if (steady) {
      const double cycle = std::max(tau, in.persist_s) + in.block_s;
      const double by_fail = std::floor((next_fail - run.wall) / cycle) - 1;
      const double by_end = std::floor((W - pos) / tau) - 1;
      const double k = std::min(by_fail, by_end);
      if (k >= 1) {
        run.wall += k * cycle;
        run.blocked += k * (cycle - tau);
        pos += k * tau;
        durable = pos - tau;  // the one before the last has persisted (cycle >= persist)
        if (in.persist_s > 0) {
          pending = pos;
          pending_at = run.wall + in.persist_s;
        } else {
          durable = pos;
        }
      }
    }
    const double seg = std::min(tau, W - pos);
    const double computed = run.wall + seg;
    double done = computed;
    double block = 0;
    if (pos + seg < W) {  // a checkpoint after this interval (none after the last)
      // The previous asynchronous checkpoint must be durable before this one starts.
      const double start = std::max(computed, pending >= 0 ? pending_at : computed);
      block = (start - computed) + in.block_s;
      done = computed + block;
    }
    if (next_fail < done) {  // a failure before this interval and its checkpoint complete
      settle(next_fail);
      run.wall = next_fail + in.restart_s + in.read_s;
      run.failures += 1;
      pos = durable;
      pending = -1;
      steady = false;
      next_fail = run.wall + exponential(rng, in.failure_rate_per_s);
      continue;
    }
    run.wall = done;
    run.blocked += block;
    pos += seg;
    settle(run.wall);
    if (pos < W) {
      if (in.persist_s > 0) {
        pending = pos;
        pending_at = run.wall + in.persist_s;
      } else {
        durable = pos;
      }
      // In rhythm once the previous checkpoint was durable before this one began.
      steady = seg == tau && durable >= pos - tau;
    }
  }
  return run;
}

Run expected(const GoodputInputs& in, double tau) {
  Run sum;
  const int n = std::max(1, in.trials);
  for (int t = 0; t < n; ++t) {
    const Run r = one_run(in, tau, Rng::stream(in.seed, "goodput/run" + std::to_string(t)));
    sum.wall += r.wall / n;
    sum.blocked += r.blocked / n;
    sum.failures += r.failures / n;
  }
  return sum;
}

}  // namespace

GoodputResult expected_goodput(const GoodputInputs& in) {
  GoodputResult g;
  if (in.work_s <= 0) return g;
  const double step = std::max(in.step_s, 1e-9);
  const double rate = in.failure_rate_per_s;
  g.young_interval_s = rate > 0 && in.block_s > 0 ? std::sqrt(2.0 * in.block_s / rate) : in.work_s;
  // Intervals are whole steps, at least one.
  auto whole_steps = [&](double tau) { return std::max(step, std::round(tau / step) * step); };
  std::vector<double> taus;
  if (in.interval_s > 0) {
    taus.push_back(whole_steps(in.interval_s));
  } else {
    const double centre = std::min(g.young_interval_s, in.work_s);
    for (int k = -16; k <= 8; ++k) taus.push_back(whole_steps(std::min(in.work_s, centre * std::pow(2.0, k / 4.0))));
    std::sort(taus.begin(), taus.end());
    taus.erase(std::unique(taus.begin(), taus.end()), taus.end());
  }
  Run best;
  best.wall = std::numeric_limits<double>::infinity();
  for (double tau : taus) {
    const Run r = expected(in, tau);
    g.curve.emplace_back(tau, in.work_s / r.wall);
    if (r.wall < best.wall) {
      best = r;
      g.interval_s = tau;
    }
  }
  g.wall_s = best.wall;
  g.goodput = in.work_s / best.wall;
  g.failures = best.failures;
  g.checkpoint_share = best.blocked / best.wall;
  g.lost_share = std::max(0.0, 1.0 - g.goodput - g.checkpoint_share);
  return g;
}

double checkpoint_bytes(const Scenario& s) {
  const models::Workload w = models::build_workload(s.model, s.training.seq_length, s.training.workload);
  return w.params_total * (2.0 + adam_state_bytes_per_param(s.plan));
}

GoodputInputs goodput_inputs(const Scenario& s, int devices, double work_s, double step_s) {
  const Reliability& rel = s.reliability;
  GoodputInputs in;
  in.work_s = work_s;
  in.step_s = step_s;
  in.seed = s.seed;
  if (!rel.enabled) return in;
  const double nodes = std::ceil(static_cast<double>(devices) / std::max(1, s.cluster.devices_per_node));
  in.failure_rate_per_s = (rel.device_mtbf_s > 0 ? devices / rel.device_mtbf_s : 0.0) +
                          (rel.node_mtbf_s > 0 ? nodes / rel.node_mtbf_s : 0.0);
  const double bytes = checkpoint_bytes(s);
  const double write = rel.storage_write_bandwidth, host = s.cluster.device.host_bandwidth.value();
  if (rel.checkpoint_async && host > 0) {
    in.block_s = bytes / devices / host;  // each device copies its share to host memory
    in.persist_s = write > 0 ? bytes / write : 0.0;
  } else {
    in.block_s = write > 0 ? bytes / write : 0.0;
  }
  in.read_s = rel.storage_read_bandwidth > 0 ? bytes / rel.storage_read_bandwidth : 0.0;
  in.restart_s = rel.restart_s;
  in.interval_s = rel.checkpoint_interval_s;
  return in;
}

}  // namespace moesim::strategies
