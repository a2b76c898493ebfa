#include "kev/result.h"

namespace kev {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::Ok: return "Ok";
    case ErrorCode::InvalidRequest: return "InvalidRequest";
    case ErrorCode::InvalidArtifact: return "InvalidArtifact";
    case ErrorCode::TokenizerMismatch: return "TokenizerMismatch";
    case ErrorCode::Unsupported: return "Unsupported";
    case ErrorCode::Device: return "Device";
    case ErrorCode::Io: return "Io";
    case ErrorCode::Internal: return "Internal";
    case ErrorCode::Unavailable: return "Unavailable";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "Ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

}  // namespace kev
