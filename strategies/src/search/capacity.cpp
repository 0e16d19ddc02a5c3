#include "moesim/strategies/search/capacity.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include <fmt/format.h>

namespace moesim::strategies {
namespace {

constexpr double kSecondsPerHour = 3600.0;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// A leading decimal number (with an optional exponent) and the text after it.
std::optional<std::pair<double, std::string_view>> leading_number(std::string_view s) {
  s = trim(s);
  double x = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (ec != std::errc() || end == s.data() || !std::isfinite(x)) return std::nullopt;
  return std::pair{x, trim(std::string_view(end, static_cast<std::size_t>(s.data() + s.size() - end)))};
}

std::optional<int> whole(std::string_view s) {
  s = trim(s);
  long long x = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  if (x < 1 || x > kMaxCapacityDevices) return std::nullopt;
  return static_cast<int>(x);
}

std::string why_no_plan(const SearchReport& rep, int devices, std::int64_t batch) {
  if (rep.valid == 0)
    return "no plan of the search space divides " + std::to_string(devices) + " devices with a global batch of " +
           std::to_string(batch) + " sequences";
  if (rep.screened_fit == 0)
    return "none of the " + std::to_string(rep.valid) + " dividing plans fits in device memory (screening estimate)";
  return "no event-simulated plan fits in device memory (" + std::to_string(rep.infeasible.size()) +
         " simulated, all over capacity)";
}

}  // namespace

std::optional<double> parse_token_count(std::string_view text) {
  const auto num = leading_number(text);
  if (!num) return std::nullopt;
  const auto [x, unit] = *num;
  double mult = 0;
  if (unit.empty()) mult = 1;
  else if (unit == "T" || unit == "t") mult = 1e12;
  else if (unit == "B" || unit == "b" || unit == "G" || unit == "g") mult = 1e9;
  else if (unit == "M" || unit == "m") mult = 1e6;
  else if (unit == "K" || unit == "k") mult = 1e3;
  const double tokens = x * mult;
  if (mult == 0 || !(tokens >= 1) || !std::isfinite(tokens)) return std::nullopt;
  return tokens;
}

std::optional<double> parse_duration_s(std::string_view text) {
  const auto num = leading_number(text);
  if (!num) return std::nullopt;
  const auto [x, unit] = *num;
  double mult = 0;
  if (unit == "s") mult = 1;
  else if (unit == "m" || unit == "min") mult = 60;
  else if (unit == "h") mult = kSecondsPerHour;
  else if (unit == "d") mult = kSecondsPerDay;
  else if (unit == "w") mult = 7 * kSecondsPerDay;
  const double s = x * mult;
  if (mult == 0 || !(s > 0) || !std::isfinite(s)) return std::nullopt;
  return s;
}

std::vector<int> parse_device_counts(std::string_view text) {
  const std::string shown = "\"" + std::string(text) + "\"";
  auto fail = [&](const std::string& constraint) -> std::vector<int> {
    throw ConfigError({Diagnostic{"--devices", "", shown, constraint}});
  };
  const std::string each = "each count must be a whole number from 1 to " + std::to_string(kMaxCapacityDevices);
  std::vector<int> out;
  if (text.find(':') != std::string_view::npos) {
    std::vector<std::string_view> parts;
    for (std::size_t start = 0;;) {
      const auto colon = text.find(':', start);
      parts.push_back(text.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
      if (colon == std::string_view::npos) break;
      start = colon + 1;
    }
    if (parts.size() > 3) return fail("must be START:END (doubling) or START:END:STEP");
    const auto lo = whole(parts[0]), hi = whole(parts[1]);
    if (!lo || !hi) return fail("must be START:END or START:END:STEP; " + each);
    if (*lo > *hi) return fail("START must not exceed END");
    if (parts.size() == 3) {
      const auto step = whole(parts[2]);
      if (!step) return fail("STEP must be a whole number from 1 to " + std::to_string(kMaxCapacityDevices));
      if ((*hi - *lo) / *step + 1 > 64) return fail("gives more than 64 sizes; use a larger STEP");
      for (int n = *lo; n <= *hi; n += *step) out.push_back(n);
    } else {
      for (long long n = *lo; n <= *hi; n *= 2) out.push_back(static_cast<int>(n));
    }
  } else {
    for (std::size_t start = 0;;) {
      const auto comma = text.find(',', start);
      const auto item = text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
      const auto n = whole(item);
      if (!n) return fail("must be a count, a list A,B,C, or a range START:END[:STEP]; " + each);
      out.push_back(*n);
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (out.size() > 64) return fail("lists more than 64 sizes");
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> default_capacity_sizes(const Scenario& s) {
  const long long d = s.cluster.devices;
  const long long server = std::max(1, s.cluster.devices_per_node);
  std::set<int> sizes;
  sizes.insert(static_cast<int>(d));  // the scenario's own size is always a candidate
  for (int k = -2; k <= 3; ++k) {
    long long n = d;
    if (k < 0) {
      if (d % (1LL << -k) != 0) continue;
      n = d >> -k;
    } else {
      n = d << k;
    }
    const bool server_multiple = n % server == 0 || (n < server && server % n == 0);
    if (n >= 1 && n <= kMaxCapacityDevices && server_multiple) sizes.insert(static_cast<int>(n));
  }
  return {sizes.begin(), sizes.end()};
}

Scenario scenario_at_size(const Scenario& base, int devices, BatchScaling batch) {
  Scenario s = base;
  set_devices(s, devices);
  if (batch == BatchScaling::Proportional) {
    const double scaled = static_cast<double>(base.training.global_batch_size) * devices / base.cluster.devices;
    set_global_batch_size(s, std::max<std::int64_t>(1, std::llround(scaled)));
  }
  s.plan.dp = 0;  // derived again by whichever plan replaces this one
  return s;
}

void evaluate_capacity(CapacityReport& r) {
  std::stable_sort(r.points.begin(), r.points.end(),
                   [](const CapacityPoint& a, const CapacityPoint& b) { return a.devices < b.devices; });
  r.answer.reset();
  r.fastest.reset();
  r.cheapest.reset();
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    CapacityPoint& p = r.points[i];
    p.meets_deadline = false;
    if (!p.feasible || !(p.best.tokens_per_s > 0)) {
      p.feasible = false;
      p.tokens_per_s = p.tokens_per_s_per_device = p.mfu = p.train_s = p.days = p.device_hours = 0;
      continue;
    }
    p.tokens_per_s = p.best.tokens_per_s;
    p.tokens_per_s_per_device = p.tokens_per_s / p.devices;
    p.mfu = p.best.mfu;
    p.train_s = r.train_tokens / p.tokens_per_s;
    p.goodput = GoodputResult{};
    if (p.reliability) {
      GoodputInputs in = *p.reliability;
      in.work_s = p.train_s;
      in.step_s = p.best.step_time_s;
      p.goodput = expected_goodput(in);
    }
    p.wall_s = p.goodput.goodput > 0 ? p.train_s / p.goodput.goodput : p.train_s;
    p.days = p.wall_s / kSecondsPerDay;
    p.device_hours = p.devices * p.wall_s / kSecondsPerHour;
    p.days_failure_free = p.train_s / kSecondsPerDay;
    p.device_hours_failure_free = p.devices * p.train_s / kSecondsPerHour;
    p.meets_deadline = r.deadline_s > 0 && p.wall_s <= r.deadline_s;
    if (p.meets_deadline && !r.answer) r.answer = i;
    // Strictly better only: ties keep the smaller cluster.
    if (!r.fastest || p.wall_s < r.points[*r.fastest].wall_s) r.fastest = i;
    if (!r.cheapest || p.device_hours < r.points[*r.cheapest].device_hours) r.cheapest = i;
  }
}

CapacityReport plan_capacity(const Scenario& base, const CapacityOptions& opt) {
  std::vector<Diagnostic> problems;
  if (!(opt.train_tokens >= 1) || !std::isfinite(opt.train_tokens))
    problems.push_back({"capacity", "/train_tokens", std::to_string(opt.train_tokens),
                        "must be a positive token count (e.g. 10T)"});
  if (!(opt.deadline_s >= 0) || !std::isfinite(opt.deadline_s))
    problems.push_back({"capacity", "/deadline_s", std::to_string(opt.deadline_s), "must be positive (or 0: none)"});
  for (std::size_t i = 0; i < opt.devices.size(); ++i)
    if (opt.devices[i] < 1 || opt.devices[i] > kMaxCapacityDevices)
      problems.push_back({"capacity", "/devices/" + std::to_string(i), std::to_string(opt.devices[i]),
                          "must be from 1 to " + std::to_string(kMaxCapacityDevices)});
  if (opt.simulate_top < 0)
    problems.push_back({"capacity", "/simulate_top", std::to_string(opt.simulate_top), "must be positive (or 0: default)"});
  if (!problems.empty()) throw ConfigError(problems);

  CapacityReport r;
  r.reliability = base.reliability;
  r.checkpoint_bytes = checkpoint_bytes(base);
  r.train_tokens = opt.train_tokens;
  r.deadline_s = opt.deadline_s;
  r.batch = opt.batch;
  std::vector<int> sizes = opt.devices.empty() ? default_capacity_sizes(base) : opt.devices;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());

  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const int n = sizes[i];
    CapacityPoint p;
    p.devices = n;
    const Scenario sc = scenario_at_size(base, n, opt.batch);
    p.global_batch_size = sc.training.global_batch_size;
    SearchReport rep;
    if (opt.known_search != nullptr && n == base.cluster.devices &&
        sc.training.global_batch_size == base.training.global_batch_size) {
      rep = *opt.known_search;
    } else {
      SearchSpace space;
      try {
        space = parse_search_space(sc);
      } catch (const ConfigError& e) {
        // An axis the user fixed that cannot work at this size: a reason, not a failure.
        p.reason.clear();
        for (const auto& d : e.diagnostics()) p.reason += (p.reason.empty() ? "" : "; ") + d.to_string();
        r.points.push_back(std::move(p));
        continue;
      }
      if (space.train_tokens <= 0) space.train_tokens = opt.train_tokens;
      SearchOptions so;
      so.threads = opt.threads;
      so.top_k = opt.simulate_top;
      so.cancel = opt.cancel;
      if (opt.progress) {
        const std::string label = fmt::format("size {} of {} ({} devices): ", i + 1, sizes.size(), n);
        so.progress = [&opt, label](const char* phase, std::size_t done, std::size_t total) {
          opt.progress((label + phase).c_str(), done, total);
        };
      }
      rep = search(sc, space, so);
    }
    p.plans_valid = rep.valid;
    p.plans_fit_estimate = rep.screened_fit;
    p.plans_simulated = rep.simulated + rep.resumed;
    if (rep.ranked.empty()) {
      p.reason = why_no_plan(rep, n, p.global_batch_size);
    } else {
      p.feasible = true;
      p.best = rep.ranked.front();
      if (base.reliability.enabled) {
        Scenario with_plan = sc;
        with_plan.plan = p.best.plan;
        p.reliability = goodput_inputs(with_plan, n, 0.0, p.best.step_time_s);
      }
    }
    r.points.push_back(std::move(p));
  }
  evaluate_capacity(r);
  return r;
}

nlohmann::json to_json(const CapacityReport& r) {
  nlohmann::json j;
  j["train_tokens"] = r.train_tokens;
  if (r.reliability.enabled) {
    nlohmann::json src = nlohmann::json::object();
    for (const auto& [k, v] : r.reliability.sources) src[k] = v;
    j["reliability"] = {{"name", r.reliability.name},
                        {"device_mtbf_h", r.reliability.device_mtbf_s / 3600},
                        {"node_mtbf_h", r.reliability.node_mtbf_s / 3600},
                        {"checkpoint_async", r.reliability.checkpoint_async},
                        {"checkpoint_bytes", r.checkpoint_bytes},
                        {"storage_write_bandwidth", r.reliability.storage_write_bandwidth},
                        {"storage_read_bandwidth", r.reliability.storage_read_bandwidth},
                        {"restart_s", r.reliability.restart_s},
                        {"sources", src}};
  } else {
    j["reliability"] = nullptr;
  }
  j["deadline_s"] = r.deadline_s > 0 ? nlohmann::json(r.deadline_s) : nlohmann::json(nullptr);
  j["deadline_days"] = r.deadline_s > 0 ? nlohmann::json(r.deadline_s / kSecondsPerDay) : nlohmann::json(nullptr);
  j["batch_scaling"] = r.batch == BatchScaling::Fixed ? "fixed" : "proportional";
  auto devices_at = [&](const std::optional<std::size_t>& i) {
    return i ? nlohmann::json(r.points[*i].devices) : nlohmann::json(nullptr);
  };
  j["answer_devices"] = devices_at(r.answer);
  j["deadline_met"] = r.deadline_s > 0 ? nlohmann::json(r.answer.has_value()) : nlohmann::json(nullptr);
  j["fastest_devices"] = devices_at(r.fastest);
  j["cheapest_devices"] = devices_at(r.cheapest);
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : r.points) {
    nlohmann::json e;
    e["devices"] = p.devices;
    e["global_batch_size"] = p.global_batch_size;
    e["feasible"] = p.feasible;
    e["reason"] = p.reason;
    e["plans_valid"] = p.plans_valid;
    e["plans_fit_estimate"] = p.plans_fit_estimate;
    e["plans_simulated"] = p.plans_simulated;
    if (p.feasible) {
      e["key"] = p.best.key;
      e["plan"] = p.best.plan_json;
      e["step_time_s"] = p.best.step_time_s;
      e["tokens_per_s"] = p.tokens_per_s;
      e["tokens_per_s_per_device"] = p.tokens_per_s_per_device;
      e["mfu"] = p.mfu;
      e["peak_memory_bytes"] = p.best.peak_memory_bytes;
      e["bottleneck"] = p.best.bottleneck;
      e["train_s"] = p.train_s;
      e["wall_s"] = p.wall_s;
      e["days"] = p.days;
      e["device_hours"] = p.device_hours;
      e["days_failure_free"] = p.days_failure_free;
      e["device_hours_failure_free"] = p.device_hours_failure_free;
      if (p.reliability) {
        const GoodputInputs& in = *p.reliability;
        nlohmann::json curve = nlohmann::json::array();
        for (const auto& [tau, g] : p.goodput.curve) curve.push_back({tau, g});
        e["goodput"] = {{"goodput", p.goodput.goodput},
                        {"checkpoint_interval_s", p.goodput.interval_s},
                        {"young_interval_s", p.goodput.young_interval_s},
                        {"failures", p.goodput.failures},
                        {"failure_rate_per_hour", in.failure_rate_per_s * 3600},
                        {"checkpoint_block_s", in.block_s},
                        {"checkpoint_persist_s", in.persist_s},
                        {"restart_s", in.restart_s},
                        {"checkpoint_read_s", in.read_s},
                        {"checkpoint_share", p.goodput.checkpoint_share},
                        {"lost_share", p.goodput.lost_share},
                        {"curve", curve}};
      }
      e["meets_deadline"] = r.deadline_s > 0 ? nlohmann::json(p.meets_deadline) : nlohmann::json(nullptr);
    }
    pts.push_back(std::move(e));
  }
  j["points"] = pts;
  return j;
}

}  // namespace moesim::strategies
