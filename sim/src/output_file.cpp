#include "moesim/sim/output_file.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <streambuf>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moesim/sim/config.hpp"

namespace moesim {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw ConfigError({Diagnostic{path, "", "", what + (err != 0 ? std::string(": ") + std::strerror(err) : std::string())}});
}

std::atomic<unsigned> g_temp_counter{0};  // unique temporary names within the process

}  // namespace

/// A write-only stream buffer over a file descriptor that remembers the first error (errno).
class OutputFile::Buffer : public std::streambuf {
 public:
  explicit Buffer(int fd) : fd_(fd), data_(1 << 16) { setp(data_.data(), data_.data() + data_.size()); }
  ~Buffer() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  /// Writes out the buffer; false (errno in error()) on failure.
  bool drain() {
    const char* p = pbase();
    std::size_t left = static_cast<std::size_t>(pptr() - pbase());
    while (left > 0 && error_ == 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        error_ = errno;
        break;
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    setp(data_.data(), data_.data() + data_.size());
    return error_ == 0;
  }
  /// Drains, fsyncs (regular files) and closes; returns the first error (0: none).
  int finish(bool regular) {
    drain();
    if (error_ == 0 && regular && ::fsync(fd_) != 0 && errno != EINVAL) error_ = errno;
    if (::close(fd_) != 0 && error_ == 0) error_ = errno;
    fd_ = -1;
    return error_;
  }
  [[nodiscard]] int error() const { return error_; }

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  int fd_;
  std::vector<char> data_;
  int error_ = 0;
};

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  if (path_.empty()) fail("<output>", "an empty output path cannot be written", 0);
  struct stat st {};
  const bool exists = ::stat(path_.c_str(), &st) == 0;
  int fd = -1;
  if (exists && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) fail(path_, "is a folder, not a file", 0);
    fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);  // a device or a pipe: in place
    if (fd < 0) fail(path_, "cannot be written", errno);
  } else {
    // O_EXCL on a fresh name in the target's folder: the rename stays on one file system, and
    // the mode is the usual 0666 minus the umask (an existing target's mode is copied below).
    for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
      temp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_temp_counter.fetch_add(1));
      fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd < 0 && errno != EEXIST) {
        const int err = errno;
        temp_.clear();
        fail(path_, "cannot be written", err);
      }
    }
    if (fd < 0) {
      temp_.clear();
      fail(path_, "cannot be written (no free temporary name next to it)", 0);
    }
    if (exists) (void)::fchmod(fd, st.st_mode & 07777);
  }
  buf_ = std::make_unique<Buffer>(fd);
  os_ = std::make_unique<std::ostream>(buf_.get());
}

OutputFile::~OutputFile() {
  if (!committed_ && !temp_.empty()) {
    os_.reset();
    buf_.reset();  // closes the descriptor
    ::unlink(temp_.c_str());
  }
}

std::ostream& OutputFile::stream() { return *os_; }

void OutputFile::commit() {
  if (committed_) return;
  os_->flush();
  const int err = buf_->finish(!temp_.empty());
  committed_ = true;  // from here the destructor has nothing left to do but remove on failure
  if (err != 0 || os_->bad()) {
    if (!temp_.empty()) ::unlink(temp_.c_str());
    fail(path_, "cannot be written", err);
  }
  if (!temp_.empty() && ::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(temp_.c_str());
    fail(path_, "cannot be written (renaming the finished temporary over it failed)", e);
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  OutputFile f(path);
  f.stream() << text;
  f.commit();
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void refuse_output_over_input(const std::string& option, const std::string& output, const std::vector<std::string>& inputs) {
  for (const std::string& in : inputs)
    if (same_file(output, in))
      throw ConfigError({Diagnostic{output, "", "", option + " names a file this command reads (" + in +
                                                        "): writing it would destroy the input; choose another path"}});
}

}  // namespace moesim
