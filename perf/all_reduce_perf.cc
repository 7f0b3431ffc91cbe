// zpQuantAllReduce against ncclAllReduce on the same type and logical size, in the same run. Size = bytes of the
// tensor each rank holds, as nccl-tests' all_reduce_perf; busbw = algbw x 2(n-1)/n, its factor. -B gradient bits
// (default 4), -G block size, -o sum|avg. Correctness: every rank's output must equal, bit for bit, the host
// backend's over the same inputs.
#include "host/all_reduce_shards.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "perf/common.h"

namespace zp {
namespace perf {
namespace {

void counts(const SizeArgs& s, OpCounts* c) {
  const size_t ts = typeSize(s.type), count = s.bytes / ts;
  *c = OpCounts();
  c->bytes = count * ts;
  c->count = count;
  c->paramCount = count;
  c->sendBytes = count * ts;
  c->recvBytes = count * ts;  // in place: input and output are the same buffer (offsets 0)
}

void bw(const SizeArgs& s, const OpCounts& c, double seconds, double* algbw, double* busbw) {
  *algbw = seconds > 0 ? double(c.bytes) / 1e9 / seconds : 0.0;
  *busbw = s.nranks > 1 ? *algbw * 2.0 * (s.nranks - 1) / s.nranks : *algbw;
}

bool run(const RunArgs& a) {
  zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
  o.bits = a.size->bits;
  o.blockSize = a.size->blockSize;
  PERF_ZP(a.comm,
          zpQuantAllReduceEx(a.send, a.recv, a.counts->paramCount, a.size->type, a.size->redOp, &o, a.comm, a.stream));
  return true;
}

bool runNccl(const RunArgs& a) {
  PERF_NCCL(a.nccl, ncclAllReduce(a.send, a.recv, a.counts->paramCount, static_cast<ncclDataType_t>(a.size->type),
                                  static_cast<ncclRedOp_t>(a.size->redOp), a.nccl, a.stream));
  return true;
}

// The plan of host/coll_plan.h over payloads of one shard. Two hops (zpTwoHops: N equal nodes of L ranks): qgZ's
// reduce-scatter (N slices to each of the L-1 local peers, then one partial to each of the N-1 peers of the same
// local rank), then the gather in reverse (the reduced shard to the N-1 peers of the local rank, then the N payloads
// held to the L-1 local peers): twice qgZ's bytes. One hop: one payload to each other rank, then a ring all-gather
// of the n reduced payloads.
WireBytes wire(const SizeArgs& s, const OpCounts& c) {
  const size_t shard = allReduceShardCount(c.paramCount, s.nranks, s.blockSize);
  const double pb = static_cast<double>(quantPayloadBytes(shard, s.bits, s.blockSize));
  const int n = s.nranks, N = s.nodes;
  if (zpTwoHops(s)) {
    const int L = n / N;
    WireBytes w;
    w.intra = 2 * pb * N * (L - 1);
    w.inter = 2 * pb * (N - 1);
    return w;
  }
  const WireBytes scatter = directWire(pb, n, N), gather = ringWire(pb * n, n, N);
  WireBytes w;
  w.intra = scatter.intra + gather.intra;
  w.inter = scatter.inter + gather.inter;
  return w;
}

// NCCL's ring all-reduce: a reduce-scatter then an all-gather of the same bytes, 2(n-1)/n of them a rank.
WireBytes ncclRingWire(const SizeArgs& s, const OpCounts& c) {
  return ringWire(2.0 * double(c.bytes), s.nranks, s.nodes);
}

PerfOp makeOp() {
  PerfOp op = zpCollectiveOp("quant_all_reduce", counts, run, runNccl);
  op.bw = bw;
  op.quantTypesOnly = true;
  op.defaultBits = 4;
  op.reduces = true;
  op.wire = wire;
  op.ringWire = ncclRingWire;
  return op;
}

}  // namespace

std::vector<PerfOp> perfOps() { return {makeOp()}; }

}  // namespace perf
}  // namespace zp
