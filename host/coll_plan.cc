#include "host/coll_plan.h"

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <sstream>

#include "host/all_reduce_shards.h"
#include "host/base/params.h"
#include "host/dtype.h"
#include "host/quant_format.h"

namespace zp {

PlanTunables PlanTunables::fromParams() {
  PlanTunables t;
  t.chunkBytes = paramPipelineChunkBytes();
  t.maxChunks = paramPipelineMaxChunks();
  t.chunkRamp = paramPipelineChunkRamp() != 0;
  t.pairAllGather = paramPairAllGather();
  t.directMinBytes = paramDirectMinBytes();
  t.directInlineWaitBytes = paramDirectInlineWaitBytes();
  t.ownSlotEarlyBytes = paramOwnSlotEarlyBytes();
  return t;
}

ChunkPlan planChunks(const PlanTunables& t, size_t count, int blockSize, size_t logicalBytes) {
  const int maxChunks = static_cast<int>(std::min<int64_t>(t.maxChunks, kMaxPipelineChunks));
  return makeChunkPlan(count, blockSize, logicalBytes, t.chunkBytes, maxChunks, t.chunkRamp);
}

namespace {

// At least `from` bytes, where a negative threshold means never.
bool atLeast(size_t bytes, int64_t from) { return from >= 0 && bytes >= static_cast<size_t>(from); }

// The whole call as one piece (the direct and exact paths).
ChunkPlan oneChunk(size_t count) {
  ChunkPlan p;
  p.count = count;
  if (count == 0) return p;
  p.chunks = 1;
  p.bounds[1] = count;
  return p;
}

// Whether two ranks exchange their slots by one all-gather (ZP_PAIR_ALLGATHER): same wire bytes, on NCCL's
// collective path, which over sockets runs at the ring's bandwidth that point-to-point does not reach, and over
// host shared memory gets the ZP_SHM_MIN_CTAS channels that point-to-point does not; over NVLink point-to-point is
// the faster (perf/RESULTS.md, qgZ).
bool pairGather(const PlanTunables& t, int peers, bool slowLink) {
  return peers == 2 && (t.pairAllGather == 1 || (t.pairAllGather == 2 && slowLink));
}

// Over a slow link (host shared memory, sockets) the slot that never crosses it is worked while the others travel,
// from ZP_OWN_SLOT_EARLY_BYTES: its kernels then leave the transfer's critical path. NVLink keeps the plain
// pipeline (the direct path, or NCCL's CTAs needing the SMs).
OwnSlot ownSlotFor(const PlanTunables& t, bool slowLink, size_t logicalBytes, const ChunkPlan& chunks) {
  if (!slowLink || !atLeast(logicalBytes, t.ownSlotEarlyBytes)) return OwnSlot::kWithTheOthers;
  // A call of one chunk runs on the caller's stream: the own slot goes beside it, on a side stream.
  return chunks.chunks > 1 ? OwnSlot::kFinishStage : OwnSlot::kSideStream;
}

void planGather(const PlanFacts& f, bool slowLink, CollPlan* p) {
  p->path = PlanPath::kOneHop;
  p->chunks = planChunks(f.tunables, f.count, f.blockSize, p->logicalBytes);
  p->hops = 1;
  p->hop[0] = HopPlan{Exchange::kAllGather, p->group, p->ranks, p->rank, 1, false, false};
  p->ownSlot = ownSlotFor(f.tunables, slowLink, p->logicalBytes, p->chunks);
  // The gather's kernels leave SMs to NCCL, whose transfer is the longest stage (src/cuda/green_context.h).
  p->greenStages = p->pipelined() && f.link.greenContext;
  p->sendSlots = p->ranks;
  p->scratchBytes[0] = ChunkRegion(p->chunks, p->sendSlots, f.bits, f.blockSize).bytes();
}

// qgZ's one hop: the all-to-all among every rank of the world. The kept slice, when worked early, is quantized
// straight into the receive slot its sum reads and never sent; between two ranks that exchange by a gather it is
// the pair layout (Exchange::kPairGatherInPlace): three receive slots, the sources in rank order at 0 and 2.
void planQgzOneHop(const PlanFacts& f, bool slowLink, CollPlan* p) {
  const Topology& t = *f.topo;
  p->path = t.nodes > 1 && !t.even ? PlanPath::kFlat : PlanPath::kOneHop;
  p->chunks = planChunks(f.tunables, f.count, f.blockSize, p->logicalBytes);
  p->ownSlot = ownSlotFor(f.tunables, slowLink, p->logicalBytes, p->chunks);
  const bool gather = pairGather(f.tunables, p->ranks, slowLink);
  const bool pairLayout = p->ownEarly() && gather;
  HopPlan& h = p->hop[0];
  h = HopPlan{Exchange::kSendRecv, PlanComm::kWorld, p->ranks, p->rank, 1, false, false};
  if (pairLayout) {
    h.exchange = Exchange::kPairGatherInPlace;
  } else if (p->ownEarly()) {
    h.withoutSelf = true;
  } else if (gather) {
    h.exchange = Exchange::kPairGather;
  }
  p->hops = 1;
  p->sendSlots = p->ranks;
  p->recv.slots = pairLayout ? kPairLayoutSlots : p->ranks;
  p->recv.keptSlot = !p->ownEarly() ? -1 : pairLayout ? 2 * p->rank : p->rank;
  p->recv.sourceStride = pairLayout ? 2 : 1;
  p->scratchBytes[0] = ChunkRegion(p->chunks, p->sendSlots, f.bits, f.blockSize).bytes();
  p->scratchBytes[1] = ChunkRegion(p->chunks, p->recv.slots, f.bits, f.blockSize).bytes();
}

// qgZ's first hop of two: among the ranks of one node, each sending its node's N slices a destination.
HopPlan qgzIntraHop(const PlanTunables& tu, const Topology& t) {
  return HopPlan{pairGather(tu, t.localSize, false) ? Exchange::kPairGather : Exchange::kSendRecv,
                 PlanComm::kIntra,
                 t.localSize,
                 t.localRank,
                 t.nodes,
                 false,
                 false};
}

// qgZ's second hop: among the ranks of this local rank, one a node, over the slow link, on the finish stage.
HopPlan qgzInterHop(const PlanTunables& tu, const Topology& t) {
  return HopPlan{pairGather(tu, t.nodes, true) ? Exchange::kPairGather : Exchange::kSendRecv,
                 PlanComm::kInter,
                 t.nodes,
                 t.node,
                 1,
                 false,
                 true};
}

// qgZ's two hops (host/qgz_plan.h): the intra-node all-to-all (N slots to each local peer) on the move stage, the
// inter-node one among the ranks of this local rank on the finish stage. The first hop's ranks share a node, the
// second's do not: only the second crosses a slow link.
void planQgzTwoHops(const PlanFacts& f, CollPlan* p) {
  const Topology& t = *f.topo;
  const PlanTunables& tu = f.tunables;
  p->path = PlanPath::kTwoHops;
  p->chunks = planChunks(tu, f.count, f.blockSize, p->logicalBytes);
  p->hops = 2;
  p->hop[0] = qgzIntraHop(tu, t);
  p->hop[1] = qgzInterHop(tu, t);
  p->sendSlots = p->ranks;
  p->recv.slots = p->ranks;
  p->scratchBytes[0] = ChunkRegion(p->chunks, p->sendSlots, f.bits, f.blockSize).bytes();
  p->scratchBytes[1] = ChunkRegion(p->chunks, p->recv.slots, f.bits, f.blockSize).bytes();
}

// The all-reduce's gather on several nodes of several ranks, all equal: first among the ranks of this local rank,
// one a node (each rank's payload to its peers on the other nodes), then inside the node, the N payloads each rank
// then holds. Chunk c's region holds the n slots in (local rank, node) order, so that both all-gathers run in place
// in it: the first fills this local rank's N slots, the second every local rank's.
void planGatherTwoHops(const PlanFacts& f, CollPlan* p) {
  const Topology& t = *f.topo;
  p->path = PlanPath::kTwoHops;
  p->chunks = planChunks(f.tunables, f.count, f.blockSize, p->logicalBytes);
  p->hops = 2;
  p->hop[0] = HopPlan{Exchange::kAllGather, PlanComm::kInter, t.nodes, t.node, 1, false, false};
  p->hop[1] = HopPlan{Exchange::kAllGather, PlanComm::kIntra, t.localSize, t.localRank, t.nodes, false, false};
  p->sendSlots = p->ranks;
  p->scratchBytes[0] = ChunkRegion(p->chunks, p->sendSlots, f.bits, f.blockSize).bytes();
}

}  // namespace

CollPlan planCollective(const PlanFacts& f) {
  const Topology& t = *f.topo;
  CollPlan p;
  p.kind = f.kind;
  p.inPlace = f.inPlace;
  const bool hpz = f.kind == CollKind::kHierAllGather;
  p.group = hpz ? PlanComm::kHpz : PlanComm::kWorld;
  p.ranks = hpz ? t.hpzSize : t.nranks;
  p.rank = hpz ? t.hpzRank : t.rank;
  p.logicalBytes = f.count * p.ranks * f.elemBytes;
  if (hpz && f.bits == 0) {  // moves the bits as they are
    p.path = PlanPath::kExact;
    p.chunks = oneChunk(f.count);
    p.hops = 1;
    p.hop[0] = HopPlan{Exchange::kAllGather, PlanComm::kHpz, p.ranks, p.rank, 1, false, false};
    return p;
  }
  const bool qgz = f.kind == CollKind::kQuantReduceScatter;
  const bool twoHops = (qgz || f.allReduceGather) && t.hierarchical();
  // An hpZ group of every rank of one node is the world (the cuda backend's communicators are the same).
  const bool wholeWorld = !hpz || (t.nodes == 1 && t.hpzSize == t.nranks);
  // The group's link: host shared memory on the extra channels, or sockets when it spans several nodes (an hpZ
  // group never does).
  const bool slowLink = f.link.shmChannels || (p.group == PlanComm::kWorld && t.nodes > 1);
  // The direct path: every payload of the call in the window (qgZ: each rank's n slots), which grows to hold them
  // unless a graph froze it.
  const size_t payload = quantPayloadBytes(f.count, f.bits, f.blockSize) * (qgz ? p.ranks : 1);
  const size_t window = f.window.payloadOffset + payload;
  if (!twoHops && wholeWorld && f.link.directLoads && atLeast(p.logicalBytes, f.tunables.directMinBytes) &&
      (!f.window.frozen || f.window.bytes >= window)) {
    p.path = PlanPath::kDirect;
    p.chunks = oneChunk(f.count);
    p.windowBytes = window;
    // Small calls' time is mostly the host's launches: their kernels wait for the peers themselves.
    p.inlineWaits = p.logicalBytes <= static_cast<size_t>(std::max<int64_t>(f.tunables.directInlineWaitBytes, 0));
    return p;
  }
  if (!qgz && twoHops) {
    planGatherTwoHops(f, &p);
  } else if (!qgz) {
    planGather(f, slowLink, &p);
  } else if (twoHops) {
    planQgzTwoHops(f, &p);
  } else {
    planQgzOneHop(f, slowLink, &p);
  }
  // A one-chunk call's own slot runs beside the exchange, whose NCCL CTAs need free SMs: in the green context when
  // there is one, whatever the stages use.
  p.ownInGreen = (p.ownSlot == OwnSlot::kFinishStage && p.greenStages) ||
                 (p.ownSlot == OwnSlot::kSideStream && f.link.greenContext);
  return p;
}

PlanFacts planFactsOf(const Topology& topo, const CollArgs& a) {
  PlanFacts f;
  f.topo = &topo;
  f.tunables = PlanTunables::fromParams();
  f.kind = a.kind;
  f.count = a.count;
  f.elemBytes = typeSize(a.type);
  f.bits = a.bits;
  f.blockSize = a.blockSize;
  f.allReduceGather = a.allReduceGather;
  // As addresses: the buffers need not be one array.
  const uintptr_t shard = a.count * f.elemBytes;
  const auto send = reinterpret_cast<uintptr_t>(a.sendbuff), recv = reinterpret_cast<uintptr_t>(a.recvbuff);
  if (a.kind == CollKind::kQuantReduceScatter) {
    f.inPlace = recv == send + topo.rank * shard;
  } else {
    f.inPlace = send == recv + (a.kind == CollKind::kHierAllGather ? topo.hpzRank : topo.rank) * shard;
  }
  return f;
}

ReservePlan planReserve(const Topology& topo, const PlanTunables& t, const LinkFacts& link, size_t payloadOffset,
                        size_t maxBytes) {
  const int bits = 8, blockSize = kMinBlockSize, n = topo.nranks;
  const size_t count = maxBytes / (2 * n);  // elements per rank (qwZ shard, qgZ slice)
  const ChunkPlan chunks = planChunks(t, count, blockSize, maxBytes);
  ReservePlan r;
  r.scratchBytes[0] = ChunkRegion(chunks, n, bits, blockSize).bytes();
  r.scratchBytes[1] = ChunkRegion(chunks, std::max(n, kPairLayoutSlots), bits, blockSize).bytes();
  // The all-reduce of maxBytes / 2 elements: n slots a chunk in both buffers, of shards that round up to whole blocks
  // (a large block may need more than the smallest when the shards are small).
  for (int g = kMinBlockSize; g <= kMaxBlockSize; g *= 2) {
    const size_t shard = allReduceShardCount(maxBytes / 2, n, g);
    const size_t bytes = ChunkRegion(planChunks(t, shard, g, maxBytes), n, bits, g).bytes();
    for (size_t& s : r.scratchBytes) s = std::max(s, bytes);
  }
  if (link.directLoads && atLeast(maxBytes, t.directMinBytes)) {
    r.windowBytes = payloadOffset + n * quantPayloadBytes(count, bits, blockSize);
  }
  return r;
}

TwoHopGatherSlots twoHopGatherSlots(const Topology& t) {
  const int N = t.nodes, L = t.localSize;
  TwoHopGatherSlots s;
  s.mySlot = t.localRank * N + t.node;
  for (int l = 0; l < L; ++l) {
    const int stride = N > 1 ? t.nodeRanks[1][l] - t.nodeRanks[0][l] : 1;
    bool even = stride > 0;
    for (int b = 1; b < N && even; ++b) even = t.nodeRanks[b][l] - t.nodeRanks[b - 1][l] == stride;
    if (even) {
      s.runs.push_back(TwoHopGatherSlots::Run{l * N, N, t.nodeRanks[0][l], stride});
    } else {
      for (int b = 0; b < N; ++b) s.runs.push_back(TwoHopGatherSlots::Run{l * N + b, 1, t.nodeRanks[b][l], 1});
    }
  }
  return s;
}

namespace {

// The name of enumerator `e`, from a table in the enumeration's order.
template <typename Enum, size_t N>
const char* nameOf(Enum e, const char* const (&names)[N]) {
  const auto i = static_cast<size_t>(e);
  return i < N ? names[i] : "?";
}

}  // namespace

const char* planPathName(PlanPath p) {
  static const char* const kNames[] = {"none", "direct loads", "one hop", "two hops", "one flat hop (uneven nodes)",
                                       "exact"};
  return nameOf(p, kNames);
}

const char* exchangeName(Exchange x) {
  static const char* const kNames[] = {"all-gather", "send/recv", "pair all-gather + copy", "pair all-gather in place"};
  return nameOf(x, kNames);
}

const char* planCommName(PlanComm c) {
  static const char* const kNames[] = {"world", "intra", "inter", "hpz"};
  return nameOf(c, kNames);
}

const char* ownSlotName(OwnSlot o) {
  static const char* const kNames[] = {"with the others", "early on the finish stage", "early on a side stream"};
  return nameOf(o, kNames);
}

std::ostream& operator<<(std::ostream& out, PlanPath p) { return out << planPathName(p); }
std::ostream& operator<<(std::ostream& out, Exchange x) { return out << exchangeName(x); }
std::ostream& operator<<(std::ostream& out, PlanComm c) { return out << planCommName(c); }
std::ostream& operator<<(std::ostream& out, OwnSlot o) { return out << ownSlotName(o); }

namespace {

const char* kindName(CollKind k) {
  static const char* const kNames[] = {"zpQuantize", "zpDequantize", "qwZ", "hpZ", "qgZ", "all-reduce"};
  return nameOf(k, kNames);
}

}  // namespace

std::string CollPlan::describe() const {
  std::ostringstream out;
  out << kindName(kind) << " " << planPathName(path) << " over " << planCommName(group) << " (rank " << rank << "/"
      << ranks << "), " << logicalBytes << " bytes" << (inPlace ? " in place" : "") << ", " << chunks.chunks
      << (chunks.chunks == 1 ? " chunk" : " chunks");
  if (chunks.chunks > 0) out << (chunks.chunks > 1 ? ", the first of " : " of ") << chunks.elems(0) << " elements";
  for (int h = 0; h < hops; ++h) {
    const HopPlan& x = hop[h];
    out << "; hop " << h + 1 << ": " << exchangeName(x.exchange) << " on " << planCommName(x.comm) << " (" << x.self
        << "/" << x.peers << (x.slotsPerPeer > 1 ? ", " + std::to_string(x.slotsPerPeer) + " slots a peer" : "")
        << (x.withoutSelf ? ", own slot not sent" : "") << (x.onFinishStage ? ", finish stage" : "") << ")";
  }
  if (path == PlanPath::kDirect) out << "; " << (inlineWaits ? "waits inside the kernels" : "waits in extra kernels");
  if (path != PlanPath::kDirect && path != PlanPath::kExact) {
    out << "; own slot " << ownSlotName(ownSlot) << (ownInGreen ? " (green context)" : "");
    out << "; stages " << (greenStages ? "in the green context" : "on every SM");
  }
  if (recv.slots > 0) {
    out << "; receive " << recv.slots << " slots a chunk";
    if (recv.keptSlot >= 0) out << " (kept slice in slot " << recv.keptSlot << ")";
    if (recv.sourceStride != 1) out << ", sources " << recv.sourceStride << " slots apart";
  }
  if (scratchBytes[0] + scratchBytes[1] > 0) out << "; scratch " << scratchBytes[0] << " + " << scratchBytes[1];
  if (windowBytes > 0) out << "; window " << windowBytes;
  return out.str();
}

}  // namespace zp
