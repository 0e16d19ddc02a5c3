#include "moesim/strategies/search/journal.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "moesim/sim/config.hpp"
#include "moesim/sim/output_file.hpp"
#include "moesim/sim/random.hpp"

namespace moesim::strategies {
namespace {

constexpr int kFormat = 2;  // 1: moesim 0.1.0 before the checked journal (no version, no checksums)

[[noreturn]] void refuse(const std::string& file, int line, const std::string& what) {
  throw ConfigError({Diagnostic{line > 0 ? fmt::format("{}:{}", file, line) : file, "", "", what}});
}

std::string hex(std::uint64_t h) { return fmt::format("{:016x}", h); }

bool read_whole(const std::string& path, std::string& text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  text = ss.str();
  return !in.bad();
}

}  // namespace

std::string search_fingerprint(const Scenario& base, Fidelity fidelity) {
  nlohmann::json doc = base.document;
  doc.erase("search");  // the axes choose plans; they do not change any plan's result
  std::uint64_t h = fnv1a(kVersion);
  h = fnv1a(fidelity_name(fidelity), h);
  h = fnv1a(doc.dump(), h);
  for (const std::string& f : base.input_files()) {
    if (f == base.file) continue;  // its content is the document
    std::string text;
    if (read_whole(f, text)) h = fnv1a(text, fnv1a(f, h));
  }
  return hex(h);
}

std::string SearchJournal::checksum(const std::string& fingerprint, const std::string& key, const nlohmann::json& plan,
                                    const nlohmann::json& result) {
  std::uint64_t h = fnv1a(fingerprint);
  h = fnv1a(key, h);
  h = fnv1a(plan.dump(), h);
  return hex(fnv1a(result.dump(), h));
}

std::vector<std::string> SearchJournal::check_result(const nlohmann::json& r, const JournalChecks& c) {
  std::vector<std::string> bad;
  if (!r.is_object()) return {"\"result\" is not an object"};
  auto number = [&](const char* name, double lo, double hi) -> double {
    const auto it = r.find(name);
    if (it == r.end() || !it->is_number()) {
      bad.push_back(fmt::format("result.{} must be a number", name));
      return 0;
    }
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < lo || v > hi) bad.push_back(fmt::format("result.{} = {} is outside [{}, {}]", name, v, lo, hi));
    return v;
  };
  auto string = [&](const char* name) {
    const auto it = r.find(name);
    if (it == r.end() || !it->is_string()) bad.push_back(fmt::format("result.{} must be a string", name));
  };
  const auto f = r.find("feasible");
  if (f == r.end() || !f->is_boolean()) bad.push_back("result.feasible must be true or false");
  string("infeasible_reason");
  string("bottleneck");
  constexpr double kInf = std::numeric_limits<double>::max();
  const double step = number("step_time_s", 0, kInf);
  const double tps = number("tokens_per_s", 0, kInf);
  const double mfu = number("mfu", 0, 1);
  number("peak_memory_bytes", 0, kInf);
  number("headroom_bytes", -kInf, kInf);
  const auto b = r.find("breakdown_s");
  double parts = 0;
  if (b == r.end() || !b->is_object()) {
    bad.push_back("result.breakdown_s must be an object");
  } else {
    for (const auto& [name, v] : b->items()) {
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -1e-9 * (step + 1)) {
        bad.push_back(fmt::format("result.breakdown_s.{} must be a number >= 0", name));
        continue;
      }
      parts += v.get<double>();
    }
  }
  if (!bad.empty()) return bad;
  // The parts of a result are computed from one another; a result that disagrees with itself
  // was not written by this search (edited, or corrupted).
  auto close = [](double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(std::abs(a), std::abs(b)) + 1e-300; };
  if (step > 0) {
    if (!close(tps, c.tokens_per_step / step, 1e-9))
      bad.push_back(fmt::format("result.tokens_per_s = {} but the step moves {} tokens in {} s ({})", tps, c.tokens_per_step,
                                step, c.tokens_per_step / step));
    if (c.devices > 0 && c.peak_flops_per_device > 0) {
      const double expect = c.model_flops_per_token * tps / (c.devices * c.peak_flops_per_device);
      if (!close(mfu, expect, 1e-9)) bad.push_back(fmt::format("result.mfu = {} but its tokens/s give {}", mfu, expect));
    }
    if (!close(parts, step, 1e-6))
      bad.push_back(fmt::format("result.breakdown_s adds up to {} s, not the step's {} s", parts, step));
  } else if (tps != 0) {
    bad.push_back("result.tokens_per_s must be 0 when step_time_s is 0");
  }
  return bad;
}

SearchJournal::SearchJournal(std::string out_file, bool resume, std::string fingerprint, JournalChecks checks,
                             const std::vector<std::string>& inputs)
    : target_(std::move(out_file)), fingerprint_(std::move(fingerprint)), checks_(checks) {
  if (target_.empty()) return;
  refuse_output_over_input("--out", target_, inputs);
  struct stat st {};
  const bool exists = ::stat(target_.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) refuse(target_, 0, "is a folder; --out needs a file");
  special_ = exists && !S_ISREG(st.st_mode);
  const std::string header =
      nlohmann::json{{"moesim_search", kFormat}, {"version", kVersion}, {"fingerprint", fingerprint_}}.dump() + "\n";
  if (special_) {  // a device or a pipe: written in place, nothing to resume from
    fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) refuse(target_, 0, std::string("cannot be written: ") + std::strerror(errno));
    write_line(header);
    return;
  }
  partial_ = target_ + ".partial";
  refuse_output_over_input("--out (its journal " + partial_ + ")", partial_, inputs);
  struct stat pst {};
  const bool have_partial = ::stat(partial_.c_str(), &pst) == 0 && S_ISREG(pst.st_mode);
  // Without --resume nothing already there is replaced: a results file (or an interrupted
  // search's journal) this run did not write holds someone's results.
  if (!resume && have_partial)
    refuse(partial_, 0, "holds an interrupted search's results; --resume continues it, or remove it to start afresh");
  if (!resume && exists && st.st_size > 0)
    refuse(target_, 0, "already exists; --resume reuses its results (same scenario), or remove it or choose another "
                       "--out to start afresh");
  std::string carried;  // complete lines of the source, copied into a fresh journal
  if (resume && have_partial) {
    read(partial_, true);
    fd_ = ::open(partial_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd_ < 0) refuse(partial_, 0, std::string("cannot be written: ") + std::strerror(errno));
    return;
  }
  if (resume && exists) {
    read(target_, false);
    std::string text;
    read_whole(target_, text);
    const std::size_t end = text.rfind('\n');
    const std::size_t first = text.find('\n');
    if (first != std::string::npos && end != std::string::npos && end > first) carried = text.substr(first + 1, end - first);
  }
  fd_ = ::open(partial_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) refuse(partial_, 0, std::string("cannot be written: ") + std::strerror(errno));
  if (exists) (void)::fchmod(fd_, st.st_mode & 07777);
  write_line(header + carried);
}

SearchJournal::SearchJournal(ReadOnly, std::string out_file, bool resume, std::string fingerprint, JournalChecks checks)
    : target_(std::move(out_file)), fingerprint_(std::move(fingerprint)), checks_(checks) {
  if (target_.empty() || !resume) return;
  struct stat st {};
  if (::stat(target_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return;  // a device or a pipe
  partial_ = target_ + ".partial";
  struct stat pst {};
  if (::stat(partial_.c_str(), &pst) == 0 && S_ISREG(pst.st_mode)) read(partial_, true, false);
  else if (::stat(target_.c_str(), &st) == 0) read(target_, false, false);
}

SearchJournal::~SearchJournal() {
  if (fd_ >= 0) ::close(fd_);  // an unfinished journal stays as FILE.partial for --resume
}

void SearchJournal::read(const std::string& path, bool is_partial, bool may_cut) {
  source_ = path;
  std::string text;
  if (!read_whole(path, text)) refuse(path, 0, std::string("cannot be read: ") + std::strerror(errno));
  // A last line without its newline was cut by a kill: it is dropped (and, in the journal,
  // truncated away before anything is appended, so no result is glued onto it).
  std::size_t complete = text.size();
  if (!text.empty() && text.back() != '\n') {
    const std::size_t nl = text.rfind('\n');
    complete = nl == std::string::npos ? 0 : nl + 1;
    if (is_partial && may_cut && ::truncate(path.c_str(), static_cast<off_t>(complete)) != 0)
      refuse(path, 0, std::string("cannot cut its unfinished last line: ") + std::strerror(errno));
  }
  const std::string advice = "remove it, or choose another --out, to start afresh";
  if (complete == 0) {
    if (is_partial) refuse(path, 1, "holds no complete header line; " + advice);
    refuse(path, 1, "is not a moesim search results file (empty, or no complete line); " + advice);
  }
  int line_no = 0;
  for (std::size_t pos = 0; pos < complete;) {
    const std::size_t nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      if (line_no == 1) refuse(path, 1, "is not a moesim search results file (its first line is not a header); " + advice);
      refuse(path, line_no, "is not a JSON object; remove the line (or the file) and resume");
    }
    if (line_no == 1) {
      const auto fmt_it = j.find("moesim_search");
      if (fmt_it == j.end()) refuse(path, 1, "is not a moesim search results file (no \"moesim_search\" header); " + advice);
      if (!fmt_it->is_number_integer() || fmt_it->get<int>() != kFormat)
        refuse(path, 1, fmt::format("was written by an earlier moesim (results format {}, this one writes {}); {}",
                                    json_brief(*fmt_it), kFormat, advice));
      const auto ver = j.find("version");
      const std::string version =
          ver == j.end() ? "?" : ver->is_string() ? ver->get<std::string>() : json_brief(*ver);
      if (version != kVersion)
        refuse(path, 1, fmt::format("holds results of moesim {} and this is moesim {}; {}", version, kVersion, advice));
      const auto fp = j.find("fingerprint");
      if (fp == j.end() || !fp->is_string() || fp->get<std::string>() != fingerprint_)
        refuse(path, 1,
               "holds the results of a different scenario (its model, cluster, training, plan settings, input files or "
               "fidelity differ; the search axes may change freely); " + advice);
      continue;
    }
    JournalEntry e;
    e.line = line_no;
    const auto key = j.find("key");
    const auto plan = j.find("plan");
    const auto result = j.find("result");
    const auto check = j.find("check");
    std::vector<std::string> bad;
    if (key == j.end() || !key->is_string() || key->get<std::string>().empty()) bad.push_back("\"key\" must be a non-empty string");
    if (plan == j.end() || !plan->is_object()) bad.push_back("\"plan\" must be an object");
    if (result == j.end()) bad.push_back("\"result\" is missing");
    if (check == j.end() || !check->is_string()) bad.push_back("\"check\" must be a string");
    if (bad.empty()) {
      bad = check_result(*result, checks_);
      if (bad.empty() && check->get<std::string>() != checksum(fingerprint_, *key, *plan, *result))
        bad.push_back("its checksum does not match its contents (the line was edited or corrupted)");
    }
    if (!bad.empty()) {
      std::string msg = "is not a sound result: ";
      for (std::size_t i = 0; i < bad.size(); ++i) msg += (i ? "; " : "") + bad[i];
      refuse(path, line_no, msg + "; remove the line (or the file) and resume");
    }
    e.key = key->get<std::string>();
    e.plan = *plan;
    e.result = *result;
    previous_[e.key] = std::move(e);
  }
}

const JournalEntry* SearchJournal::find(const std::string& key) const {
  const auto it = previous_.find(key);
  return it == previous_.end() ? nullptr : &it->second;
}

void SearchJournal::write_line(const std::string& text) {
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      refuse(special_ ? target_ : partial_, 0, std::string("cannot be written: ") + std::strerror(errno));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void SearchJournal::append(const std::string& key, const nlohmann::json& plan, const nlohmann::json& result) {
  if (fd_ < 0) return;
  const std::string line = nlohmann::json{{"key", key},
                                          {"plan", plan},
                                          {"result", result},
                                          {"check", checksum(fingerprint_, key, plan, result)}}
                               .dump() +
                           "\n";
  std::lock_guard<std::mutex> lock(mu_);
  write_line(line);
}

void SearchJournal::finish() {
  if (fd_ < 0) return;
  const std::string& file = special_ ? target_ : partial_;
  int err = 0;
  if (::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) err = errno;
  if (::close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  if (err != 0) refuse(file, 0, std::string("cannot be written: ") + std::strerror(err));
  if (!special_ && ::rename(partial_.c_str(), target_.c_str()) != 0)
    refuse(target_, 0, std::string("cannot be written (renaming ") + partial_ + " over it failed): " + std::strerror(errno));
}

}  // namespace moesim::strategies
