#pragma once
// Output that cannot drive the terminal: user-provided names (a model's "name", a file name, a
// cluster description) may hold control characters — an ESC sequence could recolour, retitle
// or rewrite the user's terminal. The CLI routes std::cout and std::cerr through this filter,
// which writes every control character except newline and tab as a visible escape ("\x1b"),
// C1 controls (U+0080-U+009F in UTF-8) as "\u009b". moesim itself prints no control characters;
// JSON output is already escaped by the JSON writer, so the filter never changes it.
//
//   EscapingStreambuf out(std::cout.rdbuf());
//   std::cout.rdbuf(&out);   // restore the original before `out` goes out of scope

#include <streambuf>
#include <string>

namespace moesim::tools {

/// `text` with control characters (but newline and tab) written as visible escapes.
std::string escape_control_characters(const std::string& text);

class EscapingStreambuf : public std::streambuf {
 public:
  explicit EscapingStreambuf(std::streambuf* target) : target_(target) {}

 protected:
  int_type overflow(int_type ch) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;
  int sync() override {
    if (after_c2_) {  // a lone 0xC2 at the end of what was written so far
      after_c2_ = false;
      if (!put("\xC2", 1)) return -1;
    }
    return target_->pubsync();
  }

 private:
  bool put(const char* s, std::streamsize n) { return target_->sputn(s, n) == n; }
  std::streambuf* target_;
  bool after_c2_ = false;  ///< the previous byte was 0xC2 (the lead byte of U+0080-U+00BF)
};

}  // namespace moesim::tools
