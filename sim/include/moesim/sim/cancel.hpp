#pragma once
// Cooperative cancellation: a flag that a signal handler, a Python callback or another thread
// raises and that long loops (the engine, lowering, the strategy search) poll.
//
//   CancelFlag cancel;                       // owned by the caller; never global
//   std::thread t([&] { run_search(..., &cancel); });
//   cancel.request();                        // async-signal-safe: one lock-free atomic store
//   // the search stops its workers and throws Cancelled
//
// Raising the flag is async-signal-safe (std::atomic<bool> is lock-free on every platform we
// build on; checked below), so a SIGINT handler may call request() directly.

#include <atomic>
#include <stdexcept>

namespace moesim {

class CancelFlag {
 public:
  void request() noexcept { requested_.store(true, std::memory_order_relaxed); }
  void reset() noexcept { requested_.store(false, std::memory_order_relaxed); }
  [[nodiscard]] bool requested() const noexcept { return requested_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> requested_{false};
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

}  // namespace moesim
