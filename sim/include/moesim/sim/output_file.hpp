#pragma once
// Output files that appear whole or not at all, and never replace one of the inputs.
//
//   OutputFile out("step.json");        // a temporary next to step.json
//   write_chrome_trace(out.stream(), sim);
//   out.commit();                        // flush, check, fsync, rename over step.json
//   // an exception or a kill before commit() leaves the old step.json untouched
//
// A target that exists and is not a regular file (a terminal, a pipe, /dev/null, /dev/full) is
// written in place: a device cannot be replaced by renaming. Every write, the flush, the
// fsync and the close are checked; a failure (a full disk, a missing folder, no permission)
// is a ConfigError naming the file and the system's reason, never a silent exit 0.

#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace moesim {

class OutputFile {
 public:
  /// Opens the temporary (or the special file). Throws ConfigError when it cannot be created.
  explicit OutputFile(std::string path);
  ~OutputFile();  ///< removes the temporary unless committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  std::ostream& stream();
  /// Flushes, fsyncs and closes the temporary, checks every step, then renames it over the
  /// target. Throws ConfigError on any failure (the temporary is removed, the target untouched).
  void commit();
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  class Buffer;
  std::string path_;
  std::string temp_;  ///< empty when writing a special file in place
  std::unique_ptr<Buffer> buf_;
  std::unique_ptr<std::ostream> os_;
  bool committed_ = false;
};

/// Writes `text` to `path` through an OutputFile.
void write_file_atomically(const std::string& path, const std::string& text);

/// True when both paths name the same existing file (same device and inode).
bool same_file(const std::string& a, const std::string& b);

/// Throws ConfigError when `output` is one of `inputs` (writing it would destroy an input).
/// `option` names the output in the message ("--trace").
void refuse_output_over_input(const std::string& option, const std::string& output, const std::vector<std::string>& inputs);

}  // namespace moesim
