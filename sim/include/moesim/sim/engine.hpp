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
// A task whose end would pass the horizon `kMaxTick` stops the run with `out_of_range` set and
// `failed_task` naming it (the inputs made a step longer than ~26.7 days: an input error, not a
// wrapped time). A run given a CancelFlag polls it every few thousand events and stops with
// `cancelled` set when it is raised; at the same points it reports the events done to the
// sim::Progress attached to the flag, if any (the caller names the phase and its total, the
// task count: every task completes once).

#include <cstdint>
#include <string>
#include <vector>

#include "moesim/sim/cancel.hpp"
#include "moesim/sim/task_graph.hpp"

namespace moesim::sim {

struct RunResult {
  std::vector<Tick> start;  ///< per task
  std::vector<Tick> end;    ///< per task
  Tick makespan = 0;
  std::uint64_t events = 0;  ///< completion events processed
  bool completed = true;
  bool out_of_range = false;     ///< a task would have ended past kMaxTick
  bool cancelled = false;        ///< the CancelFlag was raised
  TaskId failed_task = kNoTask;  ///< the task that would have ended out of range
  std::string error;             ///< set when !completed
};

class Engine {
 public:
  explicit Engine(const TaskGraph& graph, const CancelFlag* cancel = nullptr) : g_(graph), cancel_(cancel) {}
  RunResult run();

 private:
  const TaskGraph& g_;
  const CancelFlag* cancel_;
};

/// The chain of tasks that determined the makespan, from the first to the last: for each task,
/// the predecessor (dependency or previous task on one of its resources) that finished exactly
/// when it started. Ties prefer dependencies, then the lowest task id.
std::vector<TaskId> critical_path(const TaskGraph& g, const RunResult& r);

}  // namespace moesim::sim
