// qgZ's two reduction kernels (device/reduce.h) on one GPU (per rank with -t > 1): the fixed-order fp32 sum of S
// block-quantized payloads, either finished into the output type (reduce_finish_sS, qgZ's last step) or
// requantized into one payload (reduce_requantize_sS, between its two hops); one segment, no divisor. Bandwidth
// counts bytes read (S payloads) plus bytes written (the output), next to a cudaMemcpyAsync of the S payloads
// (counted as read + write) in the same run: the speedup says how close a kernel comes to copying its input.
// Size = the output tensor's bytes (count * type size), as qgZ's finish writes it. -B bits (default 8), -G block
// size. Outputs are checked bit for bit against the host reference (host/reduce_ref.h), whose arithmetic the
// kernels share.
// -s / -E (requantize ops): the requantize with stochastic rounding / error feedback (launchReduceRequantizeGrad,
// bf16 residual after the memcpy baseline's target in scratch, zeroed before the checked call), against
// quantizeGradRef of the sums.
// The kernels run only on a GPU: -H is refused.
#include <cstring>
#include <vector>

#include "device/reduce.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "host/reduce_ref.h"
#include "perf/common.h"

namespace zp {
namespace perf {
namespace {

size_t outputCount(const SizeArgs& s) { return s.bytes / typeSize(s.type); }
size_t sourceBytes(const SizeArgs& s) { return quantPayloadBytes(outputCount(s), s.bits, s.blockSize); }

template <int Sources, bool Finish>
void countsReduce(const SizeArgs& s, OpCounts* c) {
  const size_t count = outputCount(s);
  *c = OpCounts();
  c->bytes = count * typeSize(s.type);
  c->count = c->paramCount = count;
  c->sendBytes = Sources * sourceBytes(s);  // payload sizes are multiples of 16: every source stays aligned
  c->recvBytes = Finish ? c->bytes : sourceBytes(s);
  c->scratchBytes = c->sendBytes;                           // the memcpy baseline's target
  if (!Finish && s.feedback) c->scratchBytes += 2 * count;  // the requantize's residual after it
}

// The requantize's gradient rounding under -s / -E: one fixed key, so that every call draws alike.
GradQuant gradOf(const SizeArgs& s) {
  GradQuant g;
  g.stochastic = s.stochastic;
  g.key = GradRandomKey{12345u, 0u, 0u, 1u};
  return g;
}

// Source k is the reference payload of the standard tensor of "rank" k, so that the sources differ.
template <int Sources>
void initSources(const SizeArgs& s, const OpCounts& c, void* payloads) {
  std::vector<char> tensor(c.bytes);
  for (int k = 0; k < Sources; ++k) {
    fillData(s.type, Fill::kSpread, k, 0, c.count, tensor.data());
    quantizeRefParallel(tensor.data(), s.type, c.count, s.bits, s.blockSize,
                        static_cast<char*>(payloads) + size_t(k) * sourceBytes(s));
  }
}

// The kernels' sums (host/reduce_ref.h): element i of source 0, then source 1, 2, ... in order.
template <int Sources>
std::vector<float> referenceSums(const SizeArgs& s, const OpCounts& c, const void* payloads) {
  std::vector<const unsigned char*> sources;
  for (int k = 0; k < Sources; ++k) sources.push_back(static_cast<const unsigned char*>(payloads) + k * sourceBytes(s));
  std::vector<float> sum(c.count);
  parallelFor(c.count, size_t(1) << 16, [&](size_t begin, size_t end) {
    sumPayloadsRef(sources, c.count, s.bits, s.blockSize, begin, end, sum.data());
  });
  return sum;
}

template <int Sources>
void expectedFinish(const SizeArgs& s, const OpCounts& c, const void* payloads, void* output) {
  const std::vector<float> sum = referenceSums<Sources>(s, c, payloads);
  parallelFor(c.count, size_t(1) << 20,
              [&](size_t begin, size_t end) { finishRef(sum.data(), s.type, 1.0f, begin, end, output); });
}

template <int Sources>
void expectedRequantize(const SizeArgs& s, const OpCounts& c, const void* payloads, void* payload) {
  const std::vector<float> sum = referenceSums<Sources>(s, c, payloads);
  if (!s.stochastic && !s.feedback) {
    quantizeRefParallel(sum.data(), zpFloat32, c.count, s.bits, s.blockSize, payload);
    return;
  }
  GradQuant g = gradOf(s);
  std::vector<uint16_t> residual(s.feedback ? c.count : 0, 0);
  g.residual = s.feedback ? residual.data() : nullptr;
  quantizeGradRef(sum.data(), zpFloat32, c.count, s.bits, s.blockSize, g, payload);
}

template <int Sources>
ReduceSources sourcesOf(const RunArgs& a) {
  const size_t stride = sourceBytes(*a.size);
  return ReduceSources{a.send, stride, Sources * stride, Sources, 1};
}

template <int Sources>
bool runFinish(const RunArgs& a) {
  const SizeArgs& s = *a.size;
  const size_t count = a.counts->paramCount;
  PERF_ZP(nullptr,
          launchReduceFinish(sourcesOf<Sources>(a), count, s.bits, s.blockSize, s.type, 1.0f, a.recv, count, a.stream));
  return true;
}

uint16_t* residualOf(const RunArgs& a) {
  return reinterpret_cast<uint16_t*>(static_cast<char*>(a.scratch) + a.counts->sendBytes);
}

template <int Sources>
bool runRequantize(const RunArgs& a) {
  const SizeArgs& s = *a.size;
  if (s.stochastic || s.feedback) {
    const GradQuantLaunch launch = gradLaunchOf(gradOf(s), s.feedback ? residualOf(a) : nullptr, a.counts->paramCount);
    PERF_ZP(nullptr, launchReduceRequantizeGrad(sourcesOf<Sources>(a), a.counts->paramCount, s.bits, s.blockSize,
                                                a.recv, a.counts->recvBytes, launch, a.stream));
    return true;
  }
  PERF_ZP(nullptr, launchReduceRequantize(sourcesOf<Sources>(a), a.counts->paramCount, s.bits, s.blockSize, a.recv,
                                          a.counts->recvBytes, a.stream));
  return true;
}

bool resetResidual(const RunArgs& a) {
  if (!a.size->feedback) return true;
  PERF_CUDA(cudaMemsetAsync(residualOf(a), 0, 2 * a.counts->paramCount, a.stream));
  return true;
}

bool memcpySources(const RunArgs& a) {
  PERF_CUDA(cudaMemcpyAsync(a.scratch, a.send, a.counts->sendBytes, cudaMemcpyDeviceToDevice, a.stream));
  return true;
}

void bwMemcpySources(const SizeArgs&, const OpCounts& c, double seconds, double* algbw, double* busbw) {
  *algbw = seconds > 0 ? 2.0 * double(c.sendBytes) / 1e9 / seconds : 0.0;
  *busbw = *algbw;
}

// Finish: the sum finished into the -d type, compared bitwise; else requantized into a payload.
template <int Sources, bool Finish>
PerfOp reduceOp(const char* name) {
  PerfOp op;
  op.name = name;
  op.runLabel = "zpccl";
  op.uses = 0;  // the kernels need no communicator
  op.defaultType = zpBfloat16;
  op.quantTypesOnly = true;
  op.defaultBits = 8;
  op.hasInPlace = false;
  op.defaultThreads = 1;
  op.gpuOnly = true;
  op.counts = countsReduce<Sources, Finish>;
  op.init = initSources<Sources>;
  op.expected = Finish ? expectedFinish<Sources> : expectedRequantize<Sources>;
  op.compare = Finish ? nullptr : comparePayload;
  op.run = Finish ? runFinish<Sources> : runRequantize<Sources>;
  if (!Finish) op.reset = resetResidual;
  op.bw = bwLocal;  // sendBytes (S payloads read) + recvBytes (output written)
  op.baselineName = "memcpy";
  op.baseline = memcpySources;
  op.baselineBw = bwMemcpySources;
  return op;
}

}  // namespace

std::vector<PerfOp> perfOps() {
  return {reduceOp<2, true>("reduce_finish_s2"),      reduceOp<3, true>("reduce_finish_s3"),
          reduceOp<4, true>("reduce_finish_s4"),      reduceOp<8, true>("reduce_finish_s8"),
          reduceOp<2, false>("reduce_requantize_s2"), reduceOp<4, false>("reduce_requantize_s4"),
          reduceOp<8, false>("reduce_requantize_s8")};
}

}  // namespace perf
}  // namespace zp
