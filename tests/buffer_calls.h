// The eight ABI calls that take buffers, counts and types, and the names their messages use: shared by the
// bad-input tables (tests/test_bad_input.cc, tests/test_bad_input_gpu.cc).
#pragma once

#include <string>

namespace zptest {

enum class Call { kQuantize, kDequantize, kQwz, kQwzEx, kHpz, kHpzEx, kQgz, kQgzEx };
inline const Call kCalls[] = {Call::kQuantize, Call::kDequantize, Call::kQwz, Call::kQwzEx,
                              Call::kHpz,      Call::kHpzEx,      Call::kQgz, Call::kQgzEx};

// The call's name, as its messages give it.
inline const char* nameOf(Call call) {
  switch (call) {
    case Call::kQuantize:
      return "zpQuantize";
    case Call::kDequantize:
      return "zpDequantize";
    case Call::kQwz:
      return "zpQuantAllGather";
    case Call::kQwzEx:
      return "zpQuantAllGatherEx";
    case Call::kHpz:
      return "zpHierAllGather";
    case Call::kHpzEx:
      return "zpHierAllGatherEx";
    case Call::kQgz:
      return "zpQuantReduceScatterA2A";
    case Call::kQgzEx:
      return "zpQuantReduceScatterA2AEx";
  }
  return "?";
}
inline std::string rowName(Call call) { return nameOf(call); }
// The names of its send and receive buffers.
inline const char* sendName(Call call) {
  return call == Call::kQuantize ? "input" : call == Call::kDequantize ? "payload" : "sendbuff";
}
inline const char* recvName(Call call) {
  return call == Call::kQuantize ? "payload" : call == Call::kDequantize ? "output" : "recvbuff";
}
inline bool sendIsPayload(Call call) { return call == Call::kDequantize; }
inline bool recvIsPayload(Call call) { return call == Call::kQuantize; }

}  // namespace zptest
