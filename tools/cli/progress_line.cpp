#include "progress_line.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace moesim::tools {
namespace {

constexpr double kQuietSeconds = 1.0;  ///< commands faster than this never draw
constexpr int kRedrawMs = 200;

int terminal_width() {
  winsize w{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col >= 20) return w.ws_col;
  return 80;
}

std::string seconds_text(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  if (s < 60) return fmt::format("{} s", s);
  if (s < 3600) return fmt::format("{} min {:02} s", s / 60, s % 60);
  return fmt::format("{} h {:02} min", s / 3600, s % 3600 / 60);
}

void write_stderr(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

bool stderr_is_terminal() { return isatty(STDERR_FILENO) != 0; }

std::string format_progress(const sim::Progress::Snapshot& s, int width) {
  std::string line = s.phase.empty() ? std::string("working") : s.phase;
  if (s.total > 0) {
    const double f = std::min(1.0, static_cast<double>(s.done) / static_cast<double>(s.total));
    constexpr int kBar = 20;
    const int filled = static_cast<int>(f * kBar);
    line += fmt::format(" [{}{}] {:3.0f}%", std::string(static_cast<std::size_t>(filled), '#'),
                        std::string(static_cast<std::size_t>(kBar - filled), '.'), 100 * f);
  }
  line += fmt::format("  {}", seconds_text(s.total_seconds));
  const double eta = sim::Progress::eta_seconds(s);
  if (eta >= 0 && s.phase_seconds >= 0.5) line += fmt::format(", ETA {}", seconds_text(eta));
  if (width > 1 && static_cast<int>(line.size()) > width - 1) line.resize(static_cast<std::size_t>(width - 1));
  return line;
}

ProgressLine::ProgressLine(const sim::Progress& progress, bool enabled) : progress_(progress) {
  if (enabled) thread_ = std::thread([this] { loop(); });
}

ProgressLine::~ProgressLine() { stop(); }

void ProgressLine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ProgressLine::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::size_t last_len = 0;
  while (!cv_.wait_for(lock, std::chrono::milliseconds(kRedrawMs), [this] { return stopping_; })) {
    const sim::Progress::Snapshot s = progress_.snapshot();
    if (s.total_seconds < kQuietSeconds) continue;
    const std::string line = format_progress(s, terminal_width());
    // Pad over what the previous, longer line left behind, then return to the line's start.
    std::string out = "\r" + line;
    if (line.size() < last_len) out += std::string(last_len - line.size(), ' ');
    write_stderr(out);
    last_len = line.size();
    drawn_ = true;
  }
  if (drawn_) write_stderr("\r" + std::string(last_len, ' ') + "\r");
}

std::function<void(const char*, std::size_t, std::size_t)> search_progress_to(sim::Progress& progress) {
  return [&progress, last = std::string(), last_total = std::size_t{0}](const char* phase, std::size_t done,
                                                                       std::size_t total) mutable {
    if (last != phase || last_total != total) {
      last = phase;
      last_total = total;
      progress.begin(phase, total);
    }
    progress.advance(done);
  };
}

}  // namespace moesim::tools
