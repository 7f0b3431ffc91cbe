// The backward weight gather. Two tables, size = the full tensor's bytes (what each rank ends up holding):
// - hpz_all_gather: zpHierAllGather from the secondary shards (full/hpzSize each, inside the node) against
//   ZeRO-3's global ncclAllGather of the primary shards (full/nranks each). On one node the two gather over
//   the same ranks; across nodes hpZ sends nothing between them.
// - qwz_hpz_gathers: ZeRO++'s forward plus backward (zpQuantAllGather, then zpHierAllGather in place from the
//   secondary shard of the forward output) against ZeRO-3's two ncclAllGather.
// Correctness: bit for bit against the host backend over the same inputs. -B weight bits for the forward.
#include "host/dtype.h"
#include "perf/common.h"

namespace zp {
namespace perf {
namespace {

// hpZ groups are whole nodes (the default config); this rank's index inside its node.
int hpzSizeOf(const SizeArgs& s) { return s.nranks / std::max(1, s.nodes); }
int hpzRankOf(const SizeArgs& s) {
  int index = 0;
  for (int r = 0; r < s.rank; ++r) index += s.nodeOf[r] == s.nodeOf[s.rank];
  return index;
}

void countsHpz(const SizeArgs& s, OpCounts* c) {
  const size_t ts = typeSize(s.type), h = hpzSizeOf(s), n = s.nranks;
  const size_t per = s.bytes / (ts * n) * n / h;  // a multiple of both shard sizes: full = per * h = (full/n) * n
  *c = OpCounts();
  c->bytes = per * h * ts;
  c->count = per * h;
  c->paramCount = per;
  c->sendBytes = per * ts;
  c->recvBytes = per * h * ts;
  c->ipSendOffset = size_t(hpzRankOf(s)) * per * ts;
}

bool runHpz(const RunArgs& a) {
  PERF_ZP(a.comm, zpHierAllGather(a.send, a.recv, a.counts->paramCount, a.size->type, a.comm, a.stream));
  return true;
}

// ZeRO-3's backward gather: every rank contributes full/nranks.
bool runGlobalGather(const RunArgs& a) {
  const size_t shard = a.counts->count / a.size->nranks;
  PERF_NCCL(a.nccl, ncclAllGather(a.send, a.recv, shard, static_cast<ncclDataType_t>(a.size->type), a.nccl, a.stream));
  return true;
}

WireBytes wireHpz(const SizeArgs& s, const OpCounts& c) {
  WireBytes w;
  w.intra = static_cast<double>(c.paramCount) * typeSize(s.type) * (hpzSizeOf(s) - 1);
  return w;
}

// Forward plus backward: the primary shard (full/nranks) is gathered quantized into scratch (the forward
// weights), then the secondary shard of that is gathered inside the node into recvbuff, which must rebuild the
// forward weights exactly (checked against the host backend).
void countsBoth(const SizeArgs& s, OpCounts* c) {
  const size_t ts = typeSize(s.type), n = s.nranks;
  const size_t per = s.bytes / (ts * n);  // full = per * n, a multiple of every hpZ size (they divide n)
  countsAllGather(s, c);
  c->paramCount = per;
  c->scratchBytes = c->recvBytes;  // the forward gather's output
}

bool runBoth(const RunArgs& a) {
  const zpQuantOptions_t options = {a.size->bits, a.size->blockSize};
  const size_t full = a.counts->count, secondary = full / hpzSizeOf(*a.size), ts = typeSize(a.size->type);
  PERF_ZP(a.comm,
          zpQuantAllGatherEx(a.send, a.scratch, a.counts->paramCount, a.size->type, &options, a.comm, a.stream));
  const char* mine = static_cast<const char*>(a.scratch) + hpzRankOf(*a.size) * secondary * ts;
  PERF_ZP(a.comm, zpHierAllGather(mine, a.recv, secondary, a.size->type, a.comm, a.stream));
  return true;
}

bool runTwoNcclGathers(const RunArgs& a) {
  const auto type = static_cast<ncclDataType_t>(a.size->type);
  PERF_NCCL(a.nccl, ncclAllGather(a.send, a.scratch, a.counts->paramCount, type, a.nccl, a.stream));
  PERF_NCCL(a.nccl, ncclAllGather(a.send, a.recv, a.counts->paramCount, type, a.nccl, a.stream));
  return true;
}

// Logical bytes of both gathers.
void bwBoth(const SizeArgs& s, const OpCounts& c, double seconds, double* algbw, double* busbw) {
  OpCounts twice = c;
  twice.bytes = 2 * c.bytes;
  bwCollective(s, twice, seconds, algbw, busbw);
}

PerfOp makeHpz() {
  PerfOp op = zpCollectiveOp("hpz_all_gather", countsHpz, runHpz, runGlobalGather);
  op.wire = wireHpz;
  return op;
}

PerfOp makeBoth() {
  PerfOp op = zpCollectiveOp("qwz_hpz_gathers", countsBoth, runBoth, runTwoNcclGathers);
  op.quantTypesOnly = true;
  op.defaultBits = 8;
  op.hasInPlace = false;
  op.bw = bwBoth;
  op.ringWire = nullptr;  // two gathers: the host-backend table has no single ring to compare with
  return op;
}

}  // namespace

std::vector<PerfOp> perfOps() { return {makeHpz(), makeBoth()}; }

}  // namespace perf
}  // namespace zp
