#pragma once
// Cooperative cancellation: a flag that a signal handler, a Python callback or another thread
// raises and that long loops (the engine, lowering, the strategy search) poll.
//
//   CancelFlag cancel;                       // owned by the caller; never global
//   std::thread t([&] { run_search(..., &cancel); });
//   cancel.request();                        // async-signal-safe: one lock-free atomic store
//   // the search stops its workers and throws Cancelled
//
// The loops that poll the flag also report how far they got to a sim::Progress attached to it
// (sim/progress.hpp): the flag is what every long computation already receives, so progress
// needs no second parameter threaded through the library.
//
// Raising the flag is async-signal-safe (std::atomic<bool> is lock-free on every platform we
// build on; checked below), so a SIGINT handler may call request() directly.

#include <atomic>
#include <stdexcept>

namespace moesim {

namespace sim {
class Progress;
}

class CancelFlag {
 public:
  CancelFlag() = default;
  /// A flag also raised when `follows` is, with no progress of its own: for work run on several
  /// threads at once whose inner phases must not fight over one progress line.
  explicit CancelFlag(const CancelFlag* follows) noexcept : follows_(follows) {}
  CancelFlag(const CancelFlag&) = delete;
  CancelFlag& operator=(const CancelFlag&) = delete;

  void request() noexcept { requested_.store(true, std::memory_order_relaxed); }
  void reset() noexcept { requested_.store(false, std::memory_order_relaxed); }
  [[nodiscard]] bool requested() const noexcept {
    return requested_.load(std::memory_order_relaxed) || (follows_ != nullptr && follows_->requested());
  }

  /// Where the polling loops report progress (null: nowhere). Attach before the work starts.
  void attach(sim::Progress* progress) noexcept { progress_ = progress; }
  [[nodiscard]] sim::Progress* progress() const noexcept { return progress_; }

 private:
  std::atomic<bool> requested_{false};
  const CancelFlag* follows_ = nullptr;
  sim::Progress* progress_ = nullptr;
  static_assert(std::atomic<bool>::is_always_lock_free, "a signal handler must be able to raise the flag");
};

/// Thrown by the library when a CancelFlag was raised; carries no partial result.
class Cancelled : public std::runtime_error {
 public:
  Cancelled() : std::runtime_error("cancelled") {}
};

/// Throws Cancelled when the flag (which may be null) has been raised.
inline void throw_if_cancelled(const CancelFlag* flag) {
  if (flag != nullptr && flag->requested()) throw Cancelled();
}

/// The Progress attached to a flag that may be null.
inline sim::Progress* progress_of(const CancelFlag* flag) { return flag != nullptr ? flag->progress() : nullptr; }

}  // namespace moesim
