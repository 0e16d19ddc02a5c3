#pragma once
// The discrete-event engine: runs a TaskGraph and records when every task started and ended.
//
// Events are task completions ordered by (time, sequence number); the sequence number is
// assigned when the event is scheduled, so ties resolve deterministically. The hot loop does
// no allocation and no virtual dispatch: all state lives in arrays sized once per run.
//
//   sim::Engine engine(graph);           // engines share nothing; many may run at once
//   sim::RunResult r = engine.run();
//   Tick step = r.makespan;              // r.start[t], r.end[t] for every task t
//
// A graph whose stream orders and dependencies contradict each other cannot finish; the run
// then reports `completed == false` with a description of the stuck tasks (a lowering bug).

#include <cstdint>
#include <string>
#include <vector>

#include "moesim/sim/task_graph.hpp"

namespace moesim::sim {

struct RunResult {
  std::vector<Tick> start;  ///< per task
  std::vector<Tick> end;    ///< per task
  Tick makespan = 0;
  std::uint64_t events = 0;  ///< completion events processed
  bool completed = true;
  std::string error;  ///< set when !completed
};

class Engine {
 public:
  explicit Engine(const TaskGraph& graph) : g_(graph) {}
  RunResult run();

 private:
  const TaskGraph& g_;
};

/// The chain of tasks that determined the makespan, from the first to the last: for each task,
/// the predecessor (dependency or previous task on one of its resources) that finished exactly
/// when it started. Ties prefer dependencies, then the lowest task id.
std::vector<TaskId> critical_path(const TaskGraph& g, const RunResult& r);

}  // namespace moesim::sim
