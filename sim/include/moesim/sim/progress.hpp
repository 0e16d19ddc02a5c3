#pragma once
// How far a long computation got: a phase name, work done and work total, written by the
// library's long loops and read by whoever shows it (the CLI's progress line, a Python callback).
//
//   sim::Progress progress;
//   CancelFlag cancel;
//   cancel.attach(&progress);             // loops that poll the flag also report here
//   std::thread t([&] { simulate(s, &cancel); });
//   auto now = progress.snapshot();       // any thread, any time: phase, done, total, seconds
//
// Writers call begin() when a phase starts (rare: takes a mutex) and advance() as work
// completes (one relaxed atomic store, cheap enough for the engine's every 4096th event).
// Nothing here prints; nothing here allocates after begin().

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace moesim::sim {

class Progress {
 public:
  struct Snapshot {
    std::string phase;            ///< empty until the first begin()
    std::uint64_t done = 0;       ///< units of the phase's work done
    std::uint64_t total = 0;      ///< units in the phase (0: unknown)
    double phase_seconds = 0;     ///< since the phase began
    double total_seconds = 0;     ///< since the Progress was made
    std::uint64_t generation = 0; ///< bumps at every begin()
  };

  Progress() : born_(Clock::now()), phase_start_(born_) {}

  /// A new phase of `total` units (0 when not known). Resets done to 0.
  void begin(std::string phase, std::uint64_t total) {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = std::move(phase);
    phase_start_ = Clock::now();
    total_.store(total, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    ++generation_;
  }

  /// A prefix for the phases that follow ("step 2 of 8"), for work that repeats a computation
  /// whose phases are named inside it; empty: none.
  void set_context(std::string context) {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = std::move(context);
  }

  /// Units of the current phase done so far.
  void advance(std::uint64_t done) noexcept { done_.store(done, std::memory_order_relaxed); }

  [[nodiscard]] Snapshot snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    Snapshot s;
    s.phase = context_.empty() || phase_.empty() ? phase_ : context_ + ": " + phase_;
    s.done = done_.load(std::memory_order_relaxed);
    s.total = total_.load(std::memory_order_relaxed);
    s.phase_seconds = std::chrono::duration<double>(now - phase_start_).count();
    s.total_seconds = std::chrono::duration<double>(now - born_).count();
    s.generation = generation_;
    return s;
  }

  /// Seconds left in the phase at the rate so far; negative when it cannot be told yet (nothing
  /// done, or total unknown).
  [[nodiscard]] static double eta_seconds(const Snapshot& s) {
    if (s.total == 0 || s.done == 0 || s.phase_seconds <= 0) return -1;
    if (s.done >= s.total) return 0;
    return s.phase_seconds * static_cast<double>(s.total - s.done) / static_cast<double>(s.done);
  }

 private:
  using Clock = std::chrono::steady_clock;
  mutable std::mutex mu_;
  std::string phase_, context_;
  Clock::time_point born_, phase_start_;
  std::atomic<std::uint64_t> done_{0}, total_{0};
  std::uint64_t generation_ = 0;
};

/// begin() on a Progress that may be null.
inline void begin_phase(Progress* p, std::string phase, std::uint64_t total) {
  if (p != nullptr) p->begin(std::move(phase), total);
}

}  // namespace moesim::sim
