// The perf harness, nccl-tests' shape: each perf binary is one small file that fills a PerfOp per measured
// operation (name, buffer sizes for a logical size, deterministic inputs, host-reference output, bandwidth formula,
// the call itself and optionally a baseline call measured in the same run) and returns them from perfOps().
// Everything else lives in the harness: the one main (perf/main.cc), flags (perf/options.h), the rank layout
// (perf/rank_layout.h), processes (perf/proc_group.h), and the sweep with its communicators, timing, checking,
// table and JSON (perf/common.cc). See perf/README.md for the flags and launch modes.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "include/zpccl.h"
#include "perf/json_out.h"

namespace zp {
namespace perf {

struct PerfOp;

// Reporters used by the check macros below; each prints the call, file:line and the library's message.
void reportCudaError(cudaError_t err, const char* call, const char* file, int line);
void reportNcclError(ncclResult_t res, ncclComm_t comm, const char* call, const char* file, int line);
void reportZpError(zpResult_t res, zpComm_t comm, const char* call, const char* file, int line);
// The rank named in this thread's reports (set by the harness in each rank thread).
void setReportRank(int rank);

// For run functions (which return bool): on failure, report and return false. The harness then ends the run
// with exit status 1, since the other ranks are likely stuck inside the same collective.
#define PERF_CUDA(call)                                                 \
  do {                                                                  \
    cudaError_t perfErr_ = (call);                                      \
    if (perfErr_ != cudaSuccess) {                                      \
      ::zp::perf::reportCudaError(perfErr_, #call, __FILE__, __LINE__); \
      return false;                                                     \
    }                                                                   \
  } while (0)
#define PERF_NCCL(comm, call)                                                   \
  do {                                                                          \
    ncclResult_t perfRes_ = (call);                                             \
    if (perfRes_ != ncclSuccess) {                                              \
      ::zp::perf::reportNcclError(perfRes_, (comm), #call, __FILE__, __LINE__); \
      return false;                                                             \
    }                                                                           \
  } while (0)
#define PERF_ZP(comm, call)                                                   \
  do {                                                                        \
    zpResult_t perfRes_ = (call);                                             \
    if (perfRes_ != zpSuccess) {                                              \
      ::zp::perf::reportZpError(perfRes_, (comm), #call, __FILE__, __LINE__); \
      return false;                                                           \
    }                                                                         \
  } while (0)

// What an op's functions know about the point of the sweep being run, for one rank.
struct SizeArgs {
  const PerfOp* op = nullptr;
  size_t bytes = 0;  // the requested logical size (-b/-e/-f/-i), before rounding to whole elements
  zpDataType_t type = zpBfloat16;
  zpRedOp_t redOp = zpSum;
  int bits = 0;       // 0 when the op is not quantized
  int blockSize = 0;  // 0 when the op is not quantized
  int rank = 0;
  int nranks = 1;
  int nodes = 1;
  const int* nodeOf = nullptr;  // nodeOf[r]: node index of rank r (nranks entries)
  bool stochastic = false;      // -s: gradient ops round stochastically
  bool feedback = false;        // -E: gradient ops keep error-feedback residuals (in scratch)
};

// Buffer sizes of one rank for one point of the sweep.
struct OpCounts {
  size_t bytes = 0;         // logical size actually run (rounded down to whole elements per rank)
  size_t count = 0;         // elements of that logical size (the table's "count")
  size_t paramCount = 0;    // the count argument of the call (sendcount, recvcount, count per peer, ...)
  size_t sendBytes = 0;     // this rank's input
  size_t recvBytes = 0;     // this rank's output (compared with the expected output)
  size_t scratchBytes = 0;  // extra device buffer for the op's own use (e.g. a memcpy baseline's target)
  // In place, input and output share one buffer: input at ipSendOffset, output at ipRecvOffset (bytes).
  size_t ipSendOffset = 0;
  size_t ipRecvOffset = 0;
};

// The arguments of one call of an op's run or baseline function.
struct RunArgs {
  const SizeArgs* size = nullptr;
  const OpCounts* counts = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  void* scratch = nullptr;
  bool inPlace = false;
  zpBackend_t backend = zpBackendCuda;  // host: buffers are host memory and stream is NULL
  zpComm_t comm = nullptr;              // null unless the op declares kUsesZp
  ncclComm_t nccl = nullptr;            // null unless the op declares kUsesNccl (never on the host backend)
  cudaStream_t stream = nullptr;
};

typedef void (*CountsFn)(const SizeArgs& size, OpCounts* counts);
// Fills this rank's input (host memory, counts.sendBytes) deterministically from (rank, index).
typedef void (*InitFn)(const SizeArgs& size, const OpCounts& counts, void* hostSend);
// Writes this rank's expected output (counts.recvBytes) from every rank's inputs; hostSend is this rank's own
// input, as init made it (other ranks' inputs are regenerated from their rank numbers).
typedef void (*ExpectedFn)(const SizeArgs& size, const OpCounts& counts, const void* hostSend, void* hostExpected);
// Number of wrong elements of got against expected (counts.recvBytes each).
typedef uint64_t (*CompareFn)(const SizeArgs& size, const OpCounts& counts, const void* got, const void* expected);
// Algorithm and bus bandwidth in GB/s (1e9 bytes/s) of one call taking `seconds`.
typedef void (*BwFn)(const SizeArgs& size, const OpCounts& counts, double seconds, double* algbw, double* busbw);
// Enqueues one call (returns once enqueued on cuda, once done on host). False after reporting a failure.
typedef bool (*RunFn)(const RunArgs& args);
// Resets what an op's calls carry from call to call (qgZ's error-feedback residuals, in scratch), before a call
// whose output is checked; enqueued on args.stream (cuda) or done at once (host).
typedef bool (*ResetFn)(const RunArgs& args);
// Bytes one rank sends per call inside and across nodes, averaged over ranks (host-backend table).
typedef WireBytes (*WireFn)(const SizeArgs& size, const OpCounts& counts);

// How an op's standard initializer fills inputs (see fillData).
enum class Fill {
  kSpread,  // values in [-1, 1) with magnitudes spread over 2^0..2^-6: exercises quantization scales
  kExact,   // multiples of 1/8 in [-1, 1): sums are exact in any order, so NCCL reductions check bit-exact
};

enum : unsigned { kUsesZp = 1u, kUsesNccl = 2u };

struct PerfOp {
  const char* name = nullptr;      // table title and JSON "op", e.g. "qwz_all_gather"
  const char* runLabel = "zpccl";  // who runs `run`: "zpccl" or "nccl"
  unsigned uses = 0;               // communicators `run` needs (kUsesZp, kUsesNccl)
  zpDataType_t defaultType = zpBfloat16;
  bool quantTypesOnly = false;  // only half, bfloat16, float (-d)
  int defaultBits = 0;          // 0: not quantized (-B and -G ignored); else the default of -B
  bool reduces = false;         // takes -o sum|avg
  bool hasInPlace = true;
  int defaultThreads = 0;  // 0: one rank per visible GPU; e.g. 1 for single-GPU ops
  bool gpuOnly = false;    // device kernels with no host backend: -H is refused
  Fill fill = Fill::kSpread;

  CountsFn counts = nullptr;
  InitFn init = nullptr;
  // The expected output: either a host function, or (for zpccl collectives) the same `run` executed on a
  // host-backend communicator of nranks thread-ranks over the same inputs, with the measured communicator's
  // node layout (set expectedFromHostBackend). On the host backend itself the latter still checks that the
  // in-place variant and repeated calls match a fresh out-of-place run.
  ExpectedFn expected = nullptr;
  bool expectedFromHostBackend = false;
  CompareFn compare = nullptr;  // null: compareBitwise
  BwFn bw = nullptr;
  RunFn run = nullptr;
  // Optional: state carried from call to call. Then the output checked is that of one fresh call after the timed
  // ones, reset first, as the host-backend reference's (which is reset too).
  ResetFn reset = nullptr;

  // Optional baseline, measured out of place on the same buffers right after `run` (skipped on the host
  // backend when it needs NCCL).
  const char* baselineName = nullptr;  // "nccl", "memcpy", ...
  RunFn baseline = nullptr;
  unsigned baselineUses = 0;
  BwFn baselineBw = nullptr;  // null: bw

  // Host backend only: bytes sent inside/across nodes by zpccl (from the plan's formula, kept in the op file)
  // and by NCCL's ring for the same collective.
  WireFn wire = nullptr;
  WireFn ringWire = nullptr;
};

// The ops a perf binary measures, each with its own table, in this order. Each binary's own file defines it; the
// harness's main (perf/main.cc) hands them to perfMain.
std::vector<PerfOp> perfOps();

// Runs the binary: parses flags, sweeps sizes, prints the tables; returns the process exit status (0 all good,
// 1 wrong elements or a failed call, 2 bad flags). Ops run one after the other with the same flags and
// communicators. On the host backend (-H), ops that run device kernels only (gpuOnly) are left out, with a line
// saying so, unless every op is one: then -H is refused.
int perfMain(const std::vector<PerfOp>& ops, int argc, char** argv);

// ---- host-side parallelism ---------------------------------------------------------------------------------
// Inputs and references of 1 GB sizes take seconds on one core: the harness spreads them over the host's
// cores, hostThreads() per rank thread (the cores divided among this process's ranks).
void setHostThreads(int threads);  // 0: the hardware's thread count
int hostThreads();
// Calls fn(begin, end) on pieces of [0, n) of at least `grain` items, on up to hostThreads() threads.
void parallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

// quantizeRef / dequantizeRef (host/quant_ref.h) over block-aligned pieces in parallel: blocks are quantized
// independently, so the bytes are the same as one call's (padding aside).
void quantizeRefParallel(const void* input, zpDataType_t type, size_t count, int bits, int blockSize, void* payload);
void dequantizeRefParallel(const void* payload, zpDataType_t type, size_t count, int bits, int blockSize, void* output);

// ---- deterministic data ------------------------------------------------------------------------------------
uint64_t mix64(uint64_t x);
float spreadValue(int rank, uint64_t index);
float exactValue(int rank, uint64_t index);
// count elements of type at dst; element i is the value of (rank, first + i). Integer types get small
// integers (exactValue * 8). Returns false for types the harness cannot generate (fp8).
bool fillData(zpDataType_t type, Fill fill, int rank, uint64_t first, size_t count, void* dst);
bool isSupportedType(int type);

uint16_t floatToHalf(float value);  // round to nearest even
float halfToFloat(uint16_t bits);
uint16_t floatToBf16(float value);  // round to nearest even
float bf16ToFloat(uint16_t bits);
double loadAsDouble(zpDataType_t type, const void* base, size_t index);
// Rounds to nearest even for floating types; wraps for integers (as NCCL's integer sums do).
void storeFromDouble(zpDataType_t type, double value, void* base, size_t index);

// ---- standard pieces for op files --------------------------------------------------------------------------
// Buffer sizes as nccl-tests: all-gather size = total received, reduce-scatter size = total sent,
// all-to-all size = sent per rank.
void countsAllGather(const SizeArgs& size, OpCounts* counts);
void countsReduceScatter(const SizeArgs& size, OpCounts* counts);
void countsAllToAll(const SizeArgs& size, OpCounts* counts);  // no in-place variant

// Fills the whole input with fillData(op->fill) from index 0.
void initStandard(const SizeArgs& size, const OpCounts& counts, void* hostSend);
// Expected outputs of the exact collectives over initStandard inputs.
void expectedAllGather(const SizeArgs& size, const OpCounts& counts, const void* hostSend, void* hostExpected);
void expectedReduceScatter(const SizeArgs& size, const OpCounts& counts, const void* hostSend, void* hostExpected);
void expectedAllToAll(const SizeArgs& size, const OpCounts& counts, const void* hostSend, void* hostExpected);

// Elements of the data type (recvBytes / type size) whose bits differ.
uint64_t compareBitwise(const SizeArgs& size, const OpCounts& counts, const void* got, const void* expected);
// Wrong scales (one per block) plus wrong codes (one per element) of a payload of counts.count elements (size.bits,
// size.blockSize). Padding is not compared: the format fixes only where scales and codes live; the high nibble
// after an odd int4 count is padding too.
uint64_t comparePayload(const SizeArgs& size, const OpCounts& counts, const void* got, const void* expected);

// algbw = bytes / time; busbw = algbw * (n - 1) / n: all-gather, reduce-scatter and all-to-all.
double busFactorCollective(int nranks);
void bwCollective(const SizeArgs& size, const OpCounts& counts, double seconds, double* algbw, double* busbw);
// Local ops (quantize): bytes read plus bytes written, busbw = algbw.
void bwLocal(const SizeArgs& size, const OpCounts& counts, double seconds, double* algbw, double* busbw);

// NCCL's ring all-gather or reduce-scatter of `bytes` logical bytes (all-gather: total received;
// reduce-scatter: total sent) over nranks ranks in node-major order, `nodes` equal nodes: each rank sends
// n-1 chunks of bytes/n, (n-1)/n * bytes in all. Of the n ring edges, `nodes` cross a node boundary (none
// when nodes == 1), so on average a rank sends (n-1)/n * bytes * nodes/n across nodes, the rest inside.
// Per node that is (n-1)/n * bytes leaving through its one outgoing ring edge (per ring; NCCL's several rings
// each carry their share, so the total per node is the same).
WireBytes ringWire(double bytes, int nranks, int nodes);
// Every rank sends bytesPerPeer to each other rank directly: (L-1) peers inside its node, n-L outside
// (L = nranks / nodes). NCCL's all-to-all, and zpccl's one-hop exchanges of payloads.
WireBytes directWire(double bytesPerPeer, int nranks, int nodes);
// Whether zpccl's qgZ and quantized all-reduce take two hops (inside the node, then across) on this point's node
// layout (size.nodeOf, the measured communicator's): the library's own rule (host/topology.h, hierarchical()), so
// that an op's wire bytes follow the path the library took.
bool zpTwoHops(const SizeArgs& size);
WireBytes ringWireCollective(const SizeArgs& size, const OpCounts& counts);  // ringWire(counts.bytes, ...)

// The NCCL settings zpccl's own communicators get (src/cuda/cuda_backend.cc), from the facts that decide them:
// ZP_NCCL_MIN_CTAS asks every communicator for that many CTAs, else one node over host shared memory
// (shmChannelsFor) for ZP_SHM_MIN_CTAS; ZP_NET_CHANNELS_PER_PEER sets the channels per network peer. A minimum
// comes with a maximum of at least 32, as zpccl asks for it (NCCL refuses a minimum above its default maximum).
struct ZpNcclFacts {
  int nodes = 1;  // in zpccl's layout
  int nranks = 1;
  int64_t netChannelsPerPeer = 0;  // ZP_NET_CHANNELS_PER_PEER
  int64_t ncclMinCtas = 0;         // ZP_NCCL_MIN_CTAS
  int64_t shmMinCtas = 0;          // ZP_SHM_MIN_CTAS
  const char* p2pDisable = nullptr;
  const char* shmDisable = nullptr;
};
NcclChannels zpNcclChannelsFor(const ZpNcclFacts& facts);
// The same from this process's tunables and environment.
NcclChannels zpNcclChannels(int nodes, int nranks);
// A communicator of the same ranks as `comm` with those settings (ncclCommSplit, collective over comm).
ncclResult_t splitWithChannels(ncclComm_t comm, int rank, const NcclChannels& channels, ncclComm_t* out);

// NCCL baselines on the same buffers (type and op from SizeArgs).
bool runNcclAllGather(const RunArgs& args);
bool runNcclReduceScatter(const RunArgs& args);
bool runNcclAllToAll(const RunArgs& args);  // ncclGroupStart + one ncclSend/ncclRecv per peer

// The fields every op of one family shares, so that an op file sets only what is its own.
// An NCCL collective alone, checked against `expected` over initStandard inputs.
PerfOp ncclCollectiveOp(const char* name, CountsFn counts, ExpectedFn expected, RunFn run);
// A zpccl collective measured against NCCL's `baseline` in the same run, checked against the host backend.
PerfOp zpCollectiveOp(const char* name, CountsFn counts, RunFn run, RunFn baseline);

}  // namespace perf
}  // namespace zp
