// What a backend executes. The ABI entry points (init.cc, collectives.cc) check arguments and fill a CollArgs;
// a backend only runs valid requests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "include/zpccl.h"

namespace zp {

// (Numbered as the ranks exchange them in a call's signature: new kinds go last.)
enum class CollKind { kQuantize, kDequantize, kQuantAllGather, kHierAllGather, kQuantReduceScatter, kQuantAllReduce };

// qgZ's gradient rounding, resolved from the communicator and zpGradOptions_t (include/zpccl.h, "Gradient
// rounding"), for qgZ and for the all-reduce's reduce-scatter. The default rounds to nearest and keeps no residual:
// the plain block format.
struct GradArgs {
  bool stochastic = false;
  uint32_t seed = 0;
  uint32_t sequence = 0;            // the call's number among the communicator's gradient calls (or the caller's)
  int64_t sequenceOverride = -1;    // zpGradOptions_t.sequence, -1 when unset (resolved into sequence)
  uint16_t* residual = nullptr;     // bf16, the sendbuff's layout (qgZ: nranks * count); nullptr: none
  uint16_t* hopResidual = nullptr;  // bf16, nodes * count (all-reduce: * shard count; two hops only); nullptr: none
  bool any() const { return stochastic || residual != nullptr || hopResidual != nullptr; }
};

// One request, NCCL's "info" struct. count is sendcount (all-gathers), recvcount (reduce-scatter) or the
// element count (all-reduce, quantize/dequantize). bits and blockSize are resolved (per-call override or config).
struct CollArgs {
  const char* opName;
  CollKind kind;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  zpDataType_t type;
  zpRedOp_t op;
  int bits;
  int blockSize;
  cudaStream_t stream;
  GradArgs grad;  // kQuantReduceScatter and kQuantAllReduce only
  // kQuantAllGather as the second call of an all-reduce (host/all_reduce_shards.h): planned with the all-reduce's
  // hops (host/coll_plan.h).
  bool allReduceGather = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Runs one request (already checked, count > 0). Collectives not yet implemented return zpInvalidUsage.
  virtual zpResult_t run(const CollArgs& args) = 0;
  // A collective of count 0 (already checked): nothing to move. The cuda backend, like NCCL, does nothing; the
  // host backend still meets its peers and compares the arguments, so that a count of 0 against a peer's nonzero
  // count is a mismatch on every rank, not a rank that returns while its peers wait for it.
  virtual zpResult_t runEmpty(const CollArgs& args) {
    (void)args;
    return zpSuccess;
  }
  // Sizes scratch memory for collectives of up to maxBytes logical output bytes.
  virtual zpResult_t reserve(size_t maxBytes) = 0;
  virtual zpResult_t asyncError(zpResult_t* error) = 0;
  // Wakes calls blocked inside run() (host backend) so that they return zpRemoteError: the first step of an
  // abort, before finalize waits for them to leave.
  virtual void interrupt() {}
  // Releases everything; abort stops work in flight instead of waiting for it.
  virtual zpResult_t finalize(bool abort) = 0;
  // Whether ptr may be passed as a buffer of `bytes` bytes (device memory of this comm's GPU on cuda, anything
  // non-NULL on host); on false, why is set to a short reason.
  virtual bool bufferUsable(const void* ptr, const char** why) = 0;
};

}  // namespace zp
