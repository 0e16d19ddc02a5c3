// The seams between the lowering's stages (issue 14): the schedule registry's closed forms
// against the generated orders, the one memory model seen by the simulation and by the screen,
// the screen's cache key, and the network models behind one interface.
#include <catch2/catch.hpp>

#include <fstream>

#include "moesim/strategies/lower/memory.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/plan/schedule.hpp"
#include "moesim/strategies/search/screen.hpp"
#include "moesim/topologies/collective_model.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {

nlohmann::json small_moe() {
  std::ifstream in(std::string(MOESIM_SOURCE_DIR) + "/tests/scenarios/search_small_moe.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j.erase("search");
  return j;
}

/// Chunks alive at the peak of each stage's generated order (every chunk saves one unit).
std::vector<int> walked_inflight(ScheduleKind k, int pp, int vpp, int m) {
  const ScheduleTraits& t = schedule_traits(k);
  const auto orders = t.generate(pp, vpp, m, {});
  const std::vector<double> ones(static_cast<std::size_t>(vpp), 1.0);
  std::vector<int> out;
  for (const StageOrder& o : orders)
    out.push_back(walk_inflight(o, ones, ones, t.splits_weight_gradients ? Phase::WeightGrad : Phase::Backward).chunks);
  return out;
}

}  // namespace

TEST_CASE("schedule registry: one entry per kind, found by name, with its own traits", "[house][schedule]") {
  REQUIRE(all_schedules().size() == 6);
  for (std::size_t i = 0; i < all_schedules().size(); ++i) {
    const ScheduleTraits& t = all_schedules()[i];
    CHECK(static_cast<std::size_t>(t.kind) == i);
    CHECK(find_schedule(t.name) == &t);
  }
  CHECK(find_schedule("adaptive") == nullptr);
  CHECK(schedule_traits(ScheduleKind::DualPipe).bidirectional);
  CHECK(schedule_traits(ScheduleKind::DualPipe).plan_vpp == 2);
  CHECK(schedule_traits(ScheduleKind::ZeroBubbleV).v_shaped);
  CHECK_FALSE(schedule_traits(ScheduleKind::ZeroBubbleH1).v_shaped);
  // Constraints speak for themselves: DualPipe on 3 stages with 5 micro-batches has two problems.
  const auto problems = schedule_traits(ScheduleKind::DualPipe).check(3, 2, 5);
  REQUIRE(problems.size() == 2);
  CHECK(problems[0].field == "pp");
  CHECK(problems[1].field == "microbatches");
  CHECK(schedule_traits(ScheduleKind::Interleaved).check(4, 2, 8).empty());
  CHECK(schedule_traits(ScheduleKind::Interleaved).check(4, 2, 6).size() == 1);
}

TEST_CASE("schedule registry: the screen's closed-form in-flight count is the generated orders' peak",
          "[house][schedule][memory]") {
  // Exact for the schedules with a fixed order. The zero-bubble list schedules follow the
  // passes' durations, so their closed form is an estimate; with equal passes ZB-H1's is at
  // most two micro-batches above the walk (its deferred Ws) and ZB-V's one chunk above the
  // worst stage (2p + 1: measured on the 718B, whose real costs reach 37 on one stage).
  for (const ScheduleTraits& t : all_schedules())
    for (int pp : {2, 4, 8})
      for (int m : {pp, 2 * pp, 4 * pp}) {
        const int vpp = t.chunks == 0 ? 2 : t.plan_vpp;
        if (!t.check(pp, vpp, m).empty()) continue;
        const std::vector<int> walked = walked_inflight(t.kind, pp, vpp, m);
        const int worst = *std::max_element(walked.begin(), walked.end());
        for (int s = 0; s < pp; ++s) {
          INFO(t.name << " pp=" << pp << " vpp=" << vpp << " m=" << m << " stage " << s);
          const int closed = t.inflight(pp, vpp, m, s);
          if (!t.follows_costs) {
            CHECK(closed == walked[s]);
          } else if (t.kind == ScheduleKind::ZeroBubbleH1) {
            CHECK(closed >= walked[s]);
            CHECK(closed <= walked[s] + 2);
          } else {
            CHECK(closed >= worst);
            CHECK(closed <= worst + 1);
          }
        }
      }
}
