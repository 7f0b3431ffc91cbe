// zpQuantize and zpDequantize throughput on one GPU (per rank with -t > 1), in GB/s of bytes read plus bytes
// written, next to a cudaMemcpyAsync of the logical tensor (counted as read + write) measured in the same
// run. Payloads and outputs are checked bit for bit against the host reference (host/quant_ref.h).
// Size = logical tensor bytes (count * type size). -B bits (default 8), -G block size.
// quantize_grad: qgZ's sender quantization with gradient rounding (device/quantize.h launchQuantizeGrad): -s
// stochastic, -E error feedback (a bf16 residual after the memcpy target in scratch, rewritten by every timed call,
// zeroed before the checked one), against quantizeGradRef; with neither, the same kernel rounding to nearest.
#include <cstring>
#include <utility>
#include <vector>

#include "device/quantize.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "perf/common.h"

namespace zp {
namespace perf {
namespace {

size_t tensorCount(const SizeArgs& s) { return s.bytes / typeSize(s.type); }

void countsQuantize(const SizeArgs& s, OpCounts* c) {
  const size_t count = tensorCount(s);
  *c = OpCounts();
  c->bytes = count * typeSize(s.type);
  c->count = c->paramCount = count;
  c->sendBytes = c->bytes;
  c->recvBytes = quantPayloadBytes(count, s.bits, s.blockSize);
  c->scratchBytes = c->bytes;  // the memcpy baseline's target
}

void countsDequantize(const SizeArgs& s, OpCounts* c) {
  countsQuantize(s, c);
  std::swap(c->sendBytes, c->recvBytes);
}

void expectedQuantize(const SizeArgs& s, const OpCounts&, const void* tensor, void* payload) {
  quantizeRefParallel(tensor, s.type, tensorCount(s), s.bits, s.blockSize, payload);
}

// Dequantize's input is the reference payload of the standard tensor.
void initDequantize(const SizeArgs& s, const OpCounts& c, void* payload) {
  std::vector<char> tensor(c.bytes);
  fillData(s.type, Fill::kSpread, s.rank, 0, tensorCount(s), tensor.data());
  quantizeRefParallel(tensor.data(), s.type, tensorCount(s), s.bits, s.blockSize, payload);
}

void expectedDequantize(const SizeArgs& s, const OpCounts&, const void* payload, void* output) {
  dequantizeRefParallel(payload, s.type, tensorCount(s), s.bits, s.blockSize, output);
}

bool runQuantize(const RunArgs& a) {
  const SizeArgs& s = *a.size;
  PERF_ZP(a.comm, zpQuantize(a.send, a.recv, a.counts->paramCount, s.type, s.bits, s.blockSize, a.comm, a.stream));
  return true;
}

bool runDequantize(const RunArgs& a) {
  const SizeArgs& s = *a.size;
  PERF_ZP(a.comm, zpDequantize(a.send, a.recv, a.counts->paramCount, s.type, s.bits, s.blockSize, a.comm, a.stream));
  return true;
}

bool copyTensor(const RunArgs& a, const void* tensor) {
  if (a.backend == zpBackendHost) {
    std::memcpy(a.scratch, tensor, a.counts->bytes);
    return true;
  }
  PERF_CUDA(cudaMemcpyAsync(a.scratch, tensor, a.counts->bytes, cudaMemcpyDeviceToDevice, a.stream));
  return true;
}
// The tensor is quantize's input and dequantize's output.
bool memcpyQuantize(const RunArgs& a) { return copyTensor(a, a.send); }
bool memcpyDequantize(const RunArgs& a) { return copyTensor(a, a.recv); }

void bwMemcpy(const SizeArgs&, const OpCounts& c, double seconds, double* algbw, double* busbw) {
  *algbw = seconds > 0 ? 2.0 * double(c.bytes) / 1e9 / seconds : 0.0;
  *busbw = *algbw;
}

// ---- quantize_grad ----

GradQuant gradOf(const SizeArgs& s) {
  GradQuant g;
  g.stochastic = s.stochastic;
  g.key = GradRandomKey{12345u, 0u, static_cast<uint32_t>(s.rank), 0u};
  return g;
}

void countsQuantizeGrad(const SizeArgs& s, OpCounts* c) {
  countsQuantize(s, c);
  if (s.feedback) c->scratchBytes += 2 * c->count;  // the residual after the memcpy target
}

uint16_t* residualOf(const RunArgs& a) {
  return reinterpret_cast<uint16_t*>(static_cast<char*>(a.scratch) + a.counts->bytes);
}

void expectedQuantizeGrad(const SizeArgs& s, const OpCounts& c, const void* tensor, void* payload) {
  GradQuant g = gradOf(s);
  std::vector<uint16_t> residual(s.feedback ? c.count : 0, 0);
  g.residual = s.feedback ? residual.data() : nullptr;
  quantizeGradRef(tensor, s.type, c.count, s.bits, s.blockSize, g, payload);
}

bool runQuantizeGrad(const RunArgs& a) {
  const SizeArgs& s = *a.size;
  const GradQuantLaunch launch = gradLaunchOf(gradOf(s), s.feedback ? residualOf(a) : nullptr, a.counts->count);
  PERF_ZP(nullptr, launchQuantizeGrad(a.send, a.recv, a.counts->count, s.type, s.bits, s.blockSize, launch, a.stream));
  return true;
}

bool resetResidual(const RunArgs& a) {
  if (!a.size->feedback) return true;
  PERF_CUDA(cudaMemsetAsync(residualOf(a), 0, 2 * a.counts->count, a.stream));
  return true;
}

// A kernel of one GPU against a memcpy of its input in the same run.
PerfOp kernelOp(const char* name, CountsFn counts, InitFn init, ExpectedFn expected, CompareFn compare, RunFn run,
                RunFn baseline) {
  PerfOp op;
  op.name = name;
  op.runLabel = "zpccl";
  op.uses = kUsesZp;
  op.defaultType = zpBfloat16;
  op.quantTypesOnly = true;
  op.defaultBits = 8;
  op.hasInPlace = false;
  op.defaultThreads = 1;
  op.fill = Fill::kSpread;
  op.counts = counts;
  op.init = init;
  op.expected = expected;
  op.compare = compare;
  op.bw = bwLocal;
  op.run = run;
  op.baselineName = "memcpy";
  op.baseline = baseline;
  op.baselineBw = bwMemcpy;
  return op;
}

PerfOp quantizeGradOp() {
  PerfOp op = kernelOp("quantize_grad", countsQuantizeGrad, initStandard, expectedQuantizeGrad, comparePayload,
                       runQuantizeGrad, memcpyQuantize);
  op.uses = 0;  // a kernel launch: no communicator
  op.gpuOnly = true;
  op.reset = resetResidual;
  return op;
}

}  // namespace

// quantize_grad launches a kernel directly (gpuOnly): the host backend (-H) runs the other two.
std::vector<PerfOp> perfOps() {
  return {
      kernelOp("quantize", countsQuantize, initStandard, expectedQuantize, comparePayload, runQuantize, memcpyQuantize),
      kernelOp("dequantize", countsDequantize, initDequantize, expectedDequantize, nullptr, runDequantize,
               memcpyDequantize),
      quantizeGradOp()};
}

}  // namespace perf
}  // namespace zp
