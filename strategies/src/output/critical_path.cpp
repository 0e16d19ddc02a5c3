// The critical path of a simulated step, summarized for people: which kinds of work and which
// pipeline stages the chain of tasks that set the step time is made of.
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "moesim/sim/engine.hpp"
#include "moesim/strategies/output/simulate.hpp"

namespace moesim::strategies {

std::string category_words(const std::string& c) {
  static const std::map<std::string, std::string> words{
      {"compute", "compute"},
      {"recompute", "recomputation"},
      {"tp_comm", "tensor-parallel comm"},
      {"cp_comm", "context-parallel comm"},
      {"ep_comm", "expert all-to-all"},
      {"pp_comm", "pipeline send/recv"},
      {"dp_comm", "data-parallel comm"},
      {"optimizer", "optimizer"},
      {"swap", "swap to host"},
      {"launch", "host dispatch"}};
  auto it = words.find(c);
  return it != words.end() ? it->second : c;
}

CriticalPath summarize_critical_path(const Simulation& sim) {
  CriticalPath c;
  const sim::TaskGraph& g = sim.lowered.graph;
  const sim::RunResult& run = sim.run;
  c.step_s = to_seconds(run.makespan).value();
  const std::vector<sim::TaskId> path = sim::critical_path(g, run);
  c.tasks = path.size();
  std::vector<double> by_cat(g.category_names().size(), 0.0);
  std::map<int, double> by_stage;
  double covered = 0;
  for (sim::TaskId t : path) {
    const double d = to_seconds(run.end[t] - run.start[t]).value();
    if (d <= 0) continue;
    covered += d;
    by_cat[g.category(t)] += d;
    const auto res = g.resources_of(t);
    if (res.empty()) continue;
    const std::uint32_t rank = g.resource(res[0]).rank;
    if (rank < sim.lowered.ranks.size()) by_stage[sim.lowered.ranks[rank].stage] += d;
  }
  for (std::size_t k = 0; k < by_cat.size(); ++k)
    if (by_cat[k] > 0) c.by_category.emplace_back(g.category_names()[k], by_cat[k]);
  for (const auto& [stage, s] : by_stage) c.by_stage.emplace_back(stage, s);
  // Largest first; ties by name / stage, so the order is deterministic.
  std::sort(c.by_category.begin(), c.by_category.end(),
            [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; });
  std::sort(c.by_stage.begin(), c.by_stage.end(),
            [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; });
  c.unattributed_s = std::max(0.0, c.step_s - covered);
  return c;
}

nlohmann::json to_json(const CriticalPath& c) {
  nlohmann::json cat = nlohmann::json::object(), stages = nlohmann::json::array();
  for (const auto& [name, s] : c.by_category) cat[name] = s;
  for (const auto& [stage, s] : c.by_stage) stages.push_back({{"stage", stage}, {"seconds", s}});
  return {{"step_s", c.step_s},
          {"tasks", c.tasks},
          {"by_category_s", cat},
          {"by_stage", stages},
          {"unattributed_s", c.unattributed_s}};
}

std::string describe_critical_path(const CriticalPath& c) {
  if (c.step_s <= 0 || c.by_category.empty()) return "nothing (an empty step)";
  std::string out;
  for (std::size_t i = 0; i < c.by_category.size() && i < 4; ++i) {
    const auto& [name, s] = c.by_category[i];
    const double share = 100.0 * s / c.step_s;
    if (i > 0 && share < 0.5) break;
    out += fmt::format("{}{} {:.0f}%", i == 0 ? "" : ", ", category_words(name), share);
    if (i == 0 && !c.by_stage.empty())
      out += fmt::format(" (tasks of stage {}: {:.0f}% of the step)", c.by_stage.front().first,
                         100.0 * c.by_stage.front().second / c.step_s);
  }
  return out;
}

}  // namespace moesim::strategies
