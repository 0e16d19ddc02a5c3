// libFuzzer entry point for moesim::fuzz::resume (harnesses.hpp).
#include "harnesses.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  moesim::fuzz::resume(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
