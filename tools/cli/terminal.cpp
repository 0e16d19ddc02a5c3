#include "terminal.hpp"

#include <cstdio>

namespace moesim::tools {
namespace {

bool is_c0(unsigned char c) { return (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f; }

}  // namespace

std::string escape_control_characters(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    char buf[8];
    if (is_c0(c)) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9F) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(text[++i]));
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

EscapingStreambuf::int_type EscapingStreambuf::overflow(int_type ch) {
  if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
  const char c = traits_type::to_char_type(ch);
  return xsputn(&c, 1) == 1 ? ch : traits_type::eof();
}

std::streamsize EscapingStreambuf::xsputn(const char* s, std::streamsize n) {
  std::streamsize run = 0;  // start of the pending run of bytes that pass unchanged
  for (std::streamsize i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (after_c2_) {
      after_c2_ = false;
      if (c >= 0x80 && c <= 0x9F) {  // a C1 control: its lead byte 0xC2 was held back
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        if (!put(buf, 6)) return 0;
        run = i + 1;
        continue;
      }
      if (!put("\xC2", 1)) return 0;
    }
    if (c == 0xC2) {  // hold it back until the next byte says what it starts
      if (i > run && !put(s + run, i - run)) return 0;
      after_c2_ = true;
      run = i + 1;
    } else if (is_c0(c)) {
      if (i > run && !put(s + run, i - run)) return 0;
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      if (!put(buf, 4)) return 0;
      run = i + 1;
    }
  }
  if (n > run && !put(s + run, n - run)) return 0;
  return n;
}

}  // namespace moesim::tools
