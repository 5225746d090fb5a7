// Builds validation messages: "fmha: " followed by the pieces, streamed in order.
#pragma once

#include <sstream>
#include <string>

#include "fmha/status.h"

namespace fmha::detail {

template <typename... Pieces>
std::string message(const Pieces&... pieces) {
  std::ostringstream s;
  s << "fmha: ";
  (s << ... << pieces);
  return s.str();
}

template <typename... Pieces>
Status invalid(const Pieces&... pieces) {
  return Status::invalid_argument(message(pieces...));
}

}  // namespace fmha::detail
