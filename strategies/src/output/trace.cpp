// Chrome trace-event JSON of a simulated step, with filters (ranks, a time window, streams) and
// a size estimate checked before anything is written.

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "moesim/strategies/lower/lower.hpp"
#include "moesim/strategies/output/simulate.hpp"

namespace moesim::strategies {

namespace {

constexpr double kBytesPerEvent = 125;  // a complete ("X") event with its label: 76 MB for 622k on the 718B

/// The filters resolved against the run: kept simulated ranks, kept streams, the window in ticks.
struct Filter {
  std::vector<char> rank_kept;    // per simulated rank
  std::vector<char> stream_kept;  // per stream kind
  Tick from = 0, to = kMaxTick;

  Filter(const Simulation& sim, const TraceOptions& opt) {
    const auto& ranks = sim.lowered.ranks;
    std::vector<Diagnostic> bad;
    rank_kept.assign(ranks.size(), opt.ranks.empty() ? 1 : 0);
    for (int want : opt.ranks) {
      bool found = false;
      for (std::size_t i = 0; i < ranks.size(); ++i)
        if (ranks[i].global_rank == want) rank_kept[i] = found = true;
      if (!found) {
        std::string have;
        for (std::size_t i = 0; i < ranks.size() && i < 24; ++i) have += (i ? ", " : "") + std::to_string(ranks[i].global_rank);
        if (ranks.size() > 24) have += ", ...";
        bad.push_back({"--trace-ranks", "", std::to_string(want), "is not a simulated rank; simulated: " + have});
      }
    }
    stream_kept.assign(kNumStreams, opt.streams.empty() ? 1 : 0);
    for (const std::string& name : opt.streams) {
      bool found = false;
      std::string known;
      for (int k = 0; k < kNumStreams; ++k) {
        known += (k ? ", " : "") + std::string(stream_name(static_cast<Stream>(k)));
        if (name == stream_name(static_cast<Stream>(k))) stream_kept[k] = found = true;
      }
      if (!found) bad.push_back({"--trace-streams", "", "\"" + name + "\"", "is not a stream; streams: " + known});
    }
    if (opt.from_s < 0 || (opt.to_s > 0 && opt.to_s <= opt.from_s))
      bad.push_back({"--trace-window", "", fmt::format("{}:{}", opt.from_s, opt.to_s),
                     "must be FROM:TO seconds with 0 <= FROM < TO"});
    if (!bad.empty()) throw ConfigError(std::move(bad));
    from = to_ticks(Seconds{opt.from_s});
    if (opt.to_s > 0) to = to_ticks(Seconds{opt.to_s});
  }
};

/// Calls f(task, simulated rank, stream) for every interval the trace keeps.
template <class F>
void each_event(const Simulation& sim, const Filter& flt, F&& f) {
  const auto& g = sim.lowered.graph;
  const auto& run = sim.run;
  const auto& ranks = sim.lowered.ranks;
  std::vector<std::pair<int, int>> where(g.num_resources(), {-1, -1});
  for (std::size_t i = 0; i < ranks.size(); ++i)
    for (int s = 0; s < kNumStreams; ++s) where[ranks[i].streams[s]] = {static_cast<int>(i), s};
  for (sim::TaskId t = 0; t < g.num_tasks(); ++t) {
    if (run.end[t] - run.start[t] <= 0 || run.end[t] <= flt.from || run.start[t] >= flt.to) continue;
    for (sim::ResourceId res : g.resources_of(t)) {
      const auto [rank, stream] = where[res];
      if (rank < 0 || !flt.rank_kept[rank] || !flt.stream_kept[stream]) continue;  // links are not tracks
      f(t, rank, stream);
    }
  }
}

}  // namespace

TraceEstimate estimate_chrome_trace(const Simulation& sim, const TraceOptions& opt) {
  const Filter flt(sim, opt);
  TraceEstimate e;
  each_event(sim, flt, [&](sim::TaskId, int, int) { ++e.events; });
  e.bytes = static_cast<double>(e.events) * kBytesPerEvent;
  return e;
}

void write_chrome_trace(std::ostream& out, const Simulation& sim, const TraceOptions& opt) {
  const Filter flt(sim, opt);
  const TraceEstimate est = estimate_chrome_trace(sim, opt);
  if (opt.max_bytes > 0 && est.bytes > opt.max_bytes)
    throw ConfigError({Diagnostic{
        "--trace", "", fmt::format("{} events", est.events),
        fmt::format("would make a trace of about {:.2f} GB, above the {:.2f} GB limit (--trace-max-size); keep less "
                    "with --trace-ranks (of {} simulated), --trace-window FROM:TO (seconds; the step is {:.3f} s) "
                    "or --trace-streams (e.g. compute,ep)",
                    est.bytes / 1e9, opt.max_bytes / 1e9, sim.lowered.ranks.size(), sim.result.step_time_s)}});
  const auto& g = sim.lowered.graph;
  const auto& run = sim.run;
  const auto& ranks = sim.lowered.ranks;
  const auto& cats = g.category_names();
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  char buf[512];
  auto emit = [&](const char* text) {
    if (!first) out << ",\n";
    first = false;
    out << text;
  };
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (!flt.rank_kept[i]) continue;
    std::snprintf(buf, sizeof buf,
                  "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%zu,\"args\":{\"name\":\"rank %d (stage %d)\"}}", i,
                  ranks[i].global_rank, ranks[i].stage);
    emit(buf);
    std::snprintf(buf, sizeof buf, "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%zu,\"args\":{\"sort_index\":%zu}}",
                  i, i);
    emit(buf);
    for (int s = 0; s < kNumStreams; ++s) {
      if (!flt.stream_kept[s]) continue;
      std::snprintf(buf, sizeof buf,
                    "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%zu,\"tid\":%d,\"args\":{\"name\":\"%s\"}}", i, s,
                    stream_name(static_cast<Stream>(s)));
      emit(buf);
    }
  }
  each_event(sim, flt, [&](sim::TaskId t, int rank, int stream) {
    const Tick d = run.end[t] - run.start[t];
    std::snprintf(buf, sizeof buf,
                  "{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                  "\"args\":{\"microbatch\":%d}}",
                  g.label_text(g.label(t)).c_str(), cats[g.category(t)].c_str(), rank, stream,
                  static_cast<double>(run.start[t]) / 1e6, static_cast<double>(d) / 1e6, g.ordinal(t));
    emit(buf);
  });
  out << "\n]}\n";
}

}  // namespace moesim::strategies
