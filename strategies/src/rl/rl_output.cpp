// The RL step's result as JSON, as a table and as a Chrome trace.
#include <ostream>

#include <fmt/format.h>

#include "moesim/strategies/rl/rl.hpp"

namespace moesim::strategies {

// ---- Output --------------------------------------------------------------------------------

nlohmann::json to_json(const RlResult& r, const RlScenario& s, bool include_wall_time) {
  using nlohmann::json;
  json j;
  j["feasible"] = r.feasible;
  j["infeasible_reason"] = r.feasible ? json(nullptr) : json(r.infeasible_reason);
  j["model"] = s.training.model_name;
  j["cluster"] = s.cluster.name;
  j["device"] = s.cluster.device.name;
  j["mode"] = r.mode;
  j["staleness"] = r.staleness;
  j["devices"] = {{"total", r.devices}, {"training", r.training_devices}, {"inference", r.inference_devices}};
  j["step_time_s"] = r.step_time_s;
  j["tokens_per_step"] = {{"response", r.response_tokens_per_step},
                          {"prompt", r.prompt_tokens_per_step},
                          {"total", r.response_tokens_per_step + r.prompt_tokens_per_step}};
  j["tokens_per_s"] = {{"response", r.response_tokens_per_s},
                       {"total", r.total_tokens_per_s},
                       {"response_per_device", r.response_tokens_per_s_per_device},
                       {"definition",
                        "response: generated response tokens of one RL step / steady-state RL step time; total: prompt + "
                        "response tokens of the step / step time"}};
  json phases = json::array();
  for (const auto& p : r.phases) {
    json q = {{"name", p.name}, {"seconds", p.seconds}, {"devices", p.devices},
              {"share", r.step_time_s > 0 ? p.seconds / r.step_time_s : 0.0},
              {"flops_utilisation", p.flops_utilisation}};
    if (p.name == "rollout") q["hbm_bandwidth_utilisation"] = p.hbm_utilisation;
    if (p.bytes_per_device > 0) q["bytes_per_device"] = p.bytes_per_device;
    phases.push_back(q);
  }
  j["phases"] = phases;
  j["rollout"] = {{"instances", r.instances},
                  {"devices_per_instance", r.devices_per_instance},
                  {"inference_plan", {{"tp", s.rl.inference.tp}, {"pp", s.rl.inference.pp}, {"ep", s.rl.inference.ep}}},
                  {"max_sequences_per_instance", r.max_sequences_per_instance},
                  {"refill", s.rl.refill},
                  {"acceptance_length", r.acceptance_length},
                  {"draft_tokens", s.rl.inference.draft_tokens},
                  {"weight_bytes_per_device", r.weight_bytes_per_device},
                  {"kv_bytes_per_token_per_device", r.kv_bytes_per_token_per_device},
                  {"kv_budget_bytes_per_device", r.kv_budget_per_device},
                  {"mean_prompt_tokens", r.mean_prompt},
                  {"mean_response_tokens", r.mean_response},
                  {"max_response_tokens", r.max_response},
                  {"decode_step_full_batch_s", r.decode_step_full_s},
                  {"decode_step_breakdown_s",
                   {{"gemm", r.decode_full.gemm}, {"attention", r.decode_full.attention}, {"vector", r.decode_full.vector},
                    {"tp_comm", r.decode_full.tp_comm}, {"ep_comm", r.decode_full.ep_comm}, {"pp_comm", r.decode_full.pp_comm}}},
                  {"tokens_per_s_per_instance_full_batch", r.tokens_per_s_per_instance_full},
                  {"long_tail_share", r.long_tail_share},
                  {"tail_s", r.tail_s}};
  j["idle"] = {{"share", r.idle_share},
               {"training_pool_s", r.training_pool_idle_s},
               {"inference_pool_s", r.inference_pool_idle_s}};
  j["training"] = {{"plan", r.training_plan},
                   {"step_time_s", r.training_step_time_s},
                   {"optimizer_steps", s.rl.optimizer_steps},
                   {"mfu", r.training_mfu},
                   {"critic_step_time_s", r.critic_step_time_s},
                   {"token_coverage", r.training_token_coverage},
                   {"state_bytes_per_device", r.training_state_bytes_per_device}};
  j["limit"] = r.limit;
  json simj = {{"version", kVersion}, {"seed", r.seed}, {"steps_simulated", r.steps_simulated},
               {"tasks", r.tasks}, {"events", r.events}};
  if (include_wall_time) simj["wall_s"] = r.wall_s;
  j["simulator"] = simj;
  return j;
}

std::string format_rl_table(const RlResult& r, const RlScenario& s, bool include_wall_time) {
  std::string o;
  o += fmt::format("moesim {} rl: {} on {} x {} ({}), {}{}\n", kVersion, s.training.model_name, r.devices,
                   s.cluster.device.name, s.cluster.name, r.mode,
                   r.staleness > 0 ? fmt::format(", staleness {}", r.staleness) : std::string(", synchronous"));
  o += fmt::format("step: {} prompts x {} rollouts; prompt {:.0f}, response {:.0f} tokens on average (max {:.0f})\n",
                   s.rl.prompts_per_step, s.rl.rollouts_per_prompt, r.mean_prompt, r.mean_response, r.max_response);
  o += fmt::format("inference: {} instance(s) of {} devices (TP{} PP{} EP{}), up to {} sequences each{}{}\n", r.instances,
                   r.devices_per_instance, s.rl.inference.tp, s.rl.inference.pp, s.rl.inference.ep,
                   r.max_sequences_per_instance, s.rl.refill ? ", refill" : ", no refill",
                   s.rl.inference.draft_tokens > 0
                       ? fmt::format(", MTP {} draft, acceptance {:.2f}", s.rl.inference.draft_tokens, r.acceptance_length)
                       : std::string());
  o += fmt::format("training: {} on {} devices, {} optimizer step(s) of {:.3f} s (MFU {:.1f}%)\n\n", r.training_plan,
                   r.training_devices, s.rl.optimizer_steps, r.training_step_time_s, 100 * r.training_mfu);
  if (!r.feasible) o += fmt::format("  INFEASIBLE: {}\n\n", r.infeasible_reason);
  o += fmt::format("  RL step time          {:.3f} s\n", r.step_time_s);
  o += fmt::format("  response tokens/s     {:.0f} ({:.1f} per device)\n", r.response_tokens_per_s,
                   r.response_tokens_per_s_per_device);
  o += fmt::format("  prompt+response /s    {:.0f}\n", r.total_tokens_per_s);
  o += fmt::format("  idle device-time      {:.1f}%  (long tail: {:.1f}% of rollout slot-time; last 10% of responses {:.1f} s)\n\n",
                   100 * r.idle_share, 100 * r.long_tail_share, r.tail_s);
  o += "  phase                  seconds   share  devices  FLOP util  HBM util\n";
  for (const auto& p : r.phases)
    o += fmt::format("    {:<20} {:>8.3f}  {:>5.1f}%  {:>7}  {:>8.1f}%  {}\n", p.name, p.seconds,
                     r.step_time_s > 0 ? 100 * p.seconds / r.step_time_s : 0.0, p.devices, 100 * p.flops_utilisation,
                     p.name == "rollout" ? fmt::format("{:>7.1f}%", 100 * p.hbm_utilisation) : std::string("       -"));
  o += "  (phases overlap when staleness > 0 or the pools are disaggregated; shares are of the step time)\n\n";
  o += fmt::format("  limit: {}\n", r.limit);
  o += fmt::format("  simulated {} RL steps, {} tasks{}\n", r.steps_simulated, r.tasks,
                   include_wall_time ? fmt::format(" in {:.3f} s", r.wall_s) : std::string());
  return o;
}

void write_rl_trace(std::ostream& out, const RlSimulation& sim) {
  const auto& g = sim.graph;
  out << "{\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out << ",\n";
    first = false;
  };
  for (sim::ResourceId res = 0; res < g.num_resources(); ++res) {
    const auto& info = g.resource(res);
    sep();
    out << fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"{}"}}}})", res, info.name);
    sep();
    out << fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":0,"args":{{"name":"{}"}}}})", res, info.name);
  }
  for (sim::TaskId t = 0; t < g.num_tasks(); ++t) {
    for (sim::ResourceId res : g.resources_of(t)) {
      sep();
      const double ts = static_cast<double>(sim.run.start[t]) / 1e6;  // ps -> us
      const double dur = static_cast<double>(sim.run.end[t] - sim.run.start[t]) / 1e6;
      out << fmt::format(R"({{"name":"{} {}","cat":"{}","ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":0}})",
                         g.label_text(g.label(t)), sim.task_step[t], g.category_names()[g.category(t)], ts, dur, res);
    }
  }
  out << "\n]}\n";
}

}  // namespace moesim::strategies
