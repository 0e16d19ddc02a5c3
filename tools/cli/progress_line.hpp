#pragma once
// The one progress display of the CLI: every command that can run for more than a second shows
// what it is doing, how far it got and how long is left, on one line of stderr that it redraws —
// only when stderr is a terminal, so piped and redirected runs stay byte-for-byte quiet.
//
//   sim::Progress progress;
//   ProgressLine line(progress);          // draws from the first second on, every 200 ms
//   g_interrupt.attach(&progress);        // the library's long loops report through the flag
//   run(...);                             // the line clears itself when `line` is destroyed
//
// The library writes phases and counts into sim::Progress; this class only reads them, on its
// own thread, so the work never waits for the terminal.

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "moesim/sim/progress.hpp"

namespace moesim::tools {

/// True when stderr is a terminal (progress lines are drawn only then).
bool stderr_is_terminal();

/// "lowering the step [#######.......]  48%  3.1 s, about 3 s left", cut to `width` columns.
std::string format_progress(const sim::Progress::Snapshot& s, int width);

class ProgressLine {
 public:
  /// Draws `progress` when `enabled` (default: stderr is a terminal).
  explicit ProgressLine(const sim::Progress& progress, bool enabled = stderr_is_terminal());
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  /// Stops drawing and clears the line (idempotent; the destructor calls it).
  void stop();

 private:
  void loop();
  const sim::Progress& progress_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool drawn_ = false;
  std::thread thread_;
};

/// The search's progress callback (phase, done, total) writing into `progress`: a new phase or
/// total begins a phase, otherwise the count advances.
std::function<void(const char*, std::size_t, std::size_t)> search_progress_to(sim::Progress& progress);

}  // namespace moesim::tools
