// libFuzzer entry point for moesim::fuzz::cases (harnesses.hpp).
#include "harnesses.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  moesim::fuzz::cases(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
