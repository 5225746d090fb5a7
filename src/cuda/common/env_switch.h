// Switches for measuring and testing, read from the environment: NAME=0 turns off a behaviour that
// is on by default (FMHA_SM90_TMA, FMHA_HEAD_SECTIONS, FMHA_DQ_OVERLAP), NAME=1 turns on one that is
// not yet (FMHA_SM90_LONG_ROWS), NAME=<count> sets a threshold (FMHA_SM90_WIDE_WINDOW). Callers
// keep the answer in a function-local static, so each is read once per process.
#pragma once

#include <cstdlib>
#include <string_view>

namespace fmha::cuda {

inline bool switched_off_by_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string_view(value) == "0";
}

inline bool switched_on_by_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string_view(value) == "1";
}

// A non-negative count from the environment; 0 when unset or not a number.
inline long long count_from_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return 0;
  char* end = nullptr;
  const long long count = std::strtoll(value, &end, 10);
  return end != value && *end == '\0' && count > 0 ? count : 0;
}

}  // namespace fmha::cuda
