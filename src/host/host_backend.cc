#include "src/host/host_backend.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "host/all_reduce_shards.h"
#include "host/base/check.h"
#include "host/base/debug.h"
#include "host/chunk_plan.h"
#include "host/coll_plan.h"
#include "host/dtype.h"
#include "host/qgz_plan.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "host/reduce_ref.h"

namespace zp {

namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(std::shared_ptr<HostTransport> transport, const Topology& topo)
      : transport_(std::move(transport)), rank_(topo.rank), topo_(topo), qgz_(makeQgzPlan(topo)) {
    for (int r = 0; r < topo.nranks; ++r) allRanks_.push_back(r);
  }

  zpResult_t run(const CollArgs& a) override {
    return guarded(a, [&] { return dispatch(a); });
  }

  // Count 0: the ranks meet only to agree on the call.
  zpResult_t runEmpty(const CollArgs& a) override {
    return guarded(a, [&]() -> zpResult_t {
      const CallSignature sig = signatureOf(a);
      Received got;
      ZPCHECK(transport_->allGather(world(), nullptr, 0, nullptr, &sig, a.opName, &got));
      return transport_->endExchange(a.opName);
    });
  }

  zpResult_t reserve(size_t) override { return zpSuccess; }

  zpResult_t asyncError(zpResult_t* error) override {
    *error = transport_->failed() ? zpRemoteError : zpSuccess;
    return zpSuccess;
  }

  void interrupt() override { transport_->abort(); }

  zpResult_t finalize(bool abort) override {
    if (abort) transport_->abort();
    transport_->release();
    return zpSuccess;
  }

  bool bufferUsable(const void* ptr, const char** why) override {
    if (ptr == nullptr) {
      *why = "is NULL";
      return false;
    }
    return true;
  }

 private:
  // Runs a call's body so that what this rank gave to the exchanges stays valid while a peer or the transport may
  // still read it: the body ends its reads, and a call that fails (or throws) waits until nobody reads before it
  // returns and the caller may free its buffers or the communicator its scratch; a transport that cannot say so
  // keeps the scratch it was given for good. A body that throws leaves its peers waiting for it: it fails the
  // communicator, so that they wake. Every rank leaves with the verdict of endCall.
  template <class Body>
  zpResult_t guarded(const CollArgs& a, Body&& body) {
    if (transport_->failed()) {
      return ZP_ERR(zpRemoteError, "%s : the communicator %s", a.opName, transport_->failure().c_str());
    }
    struct Exit {
      HostBackend& backend;
      const char* call;
      bool returned = false;
      zpResult_t res = zpInternalError;
      ~Exit() {
        HostTransport& t = *backend.transport_;
        t.stopReading();
        if (!returned)
          t.fail("failed: rank " + std::to_string(backend.rank_) + "'s " + call + " ended with an exception");
        if ((!returned || res != zpSuccess) && !t.settle()) backend.abandonScratch();
      }
    } exit{*this, a.opName};
    exit.res = transport_->endCall(body(), a.opName);
    exit.returned = true;
    return exit.res;
  }

  zpResult_t dispatch(const CollArgs& a) {
    switch (a.kind) {
      case CollKind::kQuantize:
        quantizeRef(a.sendbuff, a.type, a.count, a.bits, a.blockSize, a.recvbuff);
        return zpSuccess;
      case CollKind::kDequantize:
        dequantizeRef(a.sendbuff, a.type, a.count, a.bits, a.blockSize, a.recvbuff);
        return zpSuccess;
      case CollKind::kQuantAllGather: {
        const CallSignature sig = signatureOf(a);
        return quantizedGather(a, planOf(a), world(), &sig);
      }
      case CollKind::kHierAllGather:
        return hierAllGather(a, planOf(a));
      case CollKind::kQuantReduceScatter: {
        const CallSignature sig = signatureOf(a);
        return quantReduceScatter(a, planOf(a), &sig);
      }
      case CollKind::kQuantAllReduce:
        return quantAllReduce(a);
    }
    return ZP_ERR(zpInternalError, "%s : unknown collective", a.opName);
  }

  // What the ranks of a collective must agree on before reading each other's data (see CallSignature). Every
  // collective's first exchange carries it; later exchanges of the same call need not, as the ranks agreed.
  static CallSignature signatureOf(const CollArgs& a) {
    CallSignature s;
    s.call = a.opName;
    s.kind = a.kind;
    s.count = a.count;
    s.type = a.type;
    if (a.kind == CollKind::kQuantReduceScatter || a.kind == CollKind::kQuantAllReduce) s.op = a.op;
    s.bits = a.bits;
    if (a.bits != 0) s.blockSize = a.blockSize;  // exact hpZ ignores the block size
    return s;
  }

  // The plan of call `a` (host/coll_plan.h), as the cuda backend would choose it on this layout without its link
  // facts (no host shared memory channels, direct loads or green context among host ranks), logged (INFO COLL). The
  // host walks its path, hops and chunks; each hop is one exchange of the transport among the hop's group, whatever
  // a hop's NCCL exchange would be.
  CollPlan planOf(const CollArgs& a) const {
    const CollPlan p = planCollective(planFactsOf(topo_, a));
    ZP_INFO(kSubsysColl, "%s : %s", a.opName, p.describe().c_str());
    return p;
  }

  // The groups of the plans' hops (PlanComm), with this rank's place in each.
  PeerGroup world() const { return PeerGroup{&allRanks_, rank_}; }
  PeerGroup intra() const { return PeerGroup{&topo_.nodeRanks[topo_.node], topo_.localRank}; }
  PeerGroup inter() const { return PeerGroup{&topo_.interRanks, topo_.node}; }
  PeerGroup hpz() const { return PeerGroup{&topo_.hpzRanks, topo_.hpzRank}; }

  // Where a transport that copies may put what an exchange of `bytes` brings; none for one that shares memory.
  unsigned char* receiveSpace(size_t bytes) {
    return transport_->sharesMemory() ? nullptr : scratch(kReceive, bytes).data();
  }

  // The quantized gather over `group`: qwZ, hpZ's quantized mode, and the all-reduce's gather. Member i's shard of
  // count elements goes to its place in recvbuff. Chunk by chunk: the own shard (sendbuff) quantized into this rank's
  // buffer, which one all-gather gives every member, and every member's payload dequantized in group order; the own
  // slot first when the plan works it early. In place is safe: the own shard is quantized before anything is written.
  // `sig`: the call's first exchange carries its signature (none when an earlier exchange of the call did).
  zpResult_t quantizedGather(const CollArgs& a, const CollPlan& p, const PeerGroup& group, const CallSignature* sig) {
    const size_t esz = typeSize(a.type);
    const ChunkPlan& chunks = p.chunks;
    const ChunkRegion at(chunks, 1, a.bits, a.blockSize);  // this rank's slot of every chunk
    std::vector<unsigned char>& mine = scratch(kSend, at.bytes());
    unsigned char* space = receiveSpace(at.bytes() * group.size());
    const auto* send = static_cast<const char*>(a.sendbuff);
    auto* recv = static_cast<char*>(a.recvbuff);
    for (int c = 0; c < chunks.chunks; ++c) {
      quantizeRef(send + chunks.offset(c) * esz, a.type, chunks.elems(c), a.bits, a.blockSize,
                  mine.data() + at.offset(c));
    }
    Received got;
    ZPCHECK(transport_->allGather(group, mine.data(), at.bytes(), space, sig, a.opName, &got));
    // Slot i of chunk c: group member i's payload of it, into its shard's chunk c.
    auto dequantize = [&](int c, int i, const unsigned char* payloads) {
      dequantizeRef(payloads + at.offset(c), a.type, chunks.elems(c), a.bits, a.blockSize,
                    recv + (i * a.count + chunks.offset(c)) * esz);
    };
    if (p.ownEarly()) {
      for (int c = 0; c < chunks.chunks; ++c) dequantize(c, p.rank, mine.data());
    }
    for (int c = 0; c < chunks.chunks; ++c) {
      for (int i = 0; i < group.size(); ++i) {
        if (p.ownEarly() && i == p.rank) continue;
        dequantize(c, i, got.block(0, i));
      }
    }
    return transport_->endExchange(a.opName);  // peers may still read our payload until here
  }

  // hpZ: every hpZ peer's shard, as it is, into its place (or the shards gathered quantized when asked). Where
  // members read each other's memory the send buffer is given as it is; a transport that copies gets only the
  // communicator's memory, so the shard is staged first.
  zpResult_t hierAllGather(const CollArgs& a, const CollPlan& p) {
    const CallSignature sig = signatureOf(a);
    if (p.path != PlanPath::kExact) return quantizedGather(a, p, hpz(), &sig);
    const size_t shardBytes = a.count * typeSize(a.type);
    const void* mine = a.sendbuff;
    if (!transport_->sharesMemory()) {
      std::vector<unsigned char>& staged = scratch(kSend, shardBytes);
      memcpy(staged.data(), a.sendbuff, shardBytes);
      mine = staged.data();
    }
    unsigned char* space = receiveSpace(shardBytes * topo_.hpzSize);
    Received got;
    ZPCHECK(transport_->allGather(hpz(), mine, shardBytes, space, &sig, a.opName, &got));
    for (int i = 0; i < topo_.hpzSize; ++i) {
      char* dst = static_cast<char*>(a.recvbuff) + i * shardBytes;
      const unsigned char* src = got.block(0, i);
      if (dst != reinterpret_cast<const char*>(src)) memcpy(dst, src, shardBytes);
    }
    return transport_->endExchange(a.opName);
  }

  // The chunks of a hop whose region `at` holds `slotsPerPeer` slots for each member, in member order.
  static std::vector<ExchangeChunk> hopChunks(const ChunkPlan& chunks, const ChunkRegion& at, int slotsPerPeer) {
    std::vector<ExchangeChunk> out;
    for (int c = 0; c < chunks.chunks; ++c) out.push_back(ExchangeChunk{at.offset(c), slotsPerPeer * at.slotBytes(c)});
    return out;
  }

  // qgZ, following qgz_plan.h step by step, chunk by chunk (each chunk covers the same element range of every
  // slice; whole blocks, so the codes, the random draws and the sums are those of whole slices). Slice d is
  // elements [d count, (d + 1) count) of sendbuff; this rank's reduced slice goes to recvbuff. `sig`: as
  // quantizedGather.
  zpResult_t quantReduceScatter(const CollArgs& a, const CollPlan& p, const CallSignature* sig) {
    const size_t esz = typeSize(a.type);
    const ChunkPlan& chunks = p.chunks;
    const int n = qgz_.nranks;
    const float divisor = a.op == zpAvg ? static_cast<float>(topo_.nranks) : 1.0f;
    const ChunkRegion sendAt(chunks, n, a.bits, a.blockSize);
    // The kept slice, when the plan works it early, is quantized apart and never read by a peer.
    const bool keptApart = p.ownEarly();
    const ChunkRegion keptAt(chunks, 1, a.bits, a.blockSize);
    std::vector<unsigned char>& send = scratch(kSend, sendAt.bytes());
    std::vector<unsigned char>& kept = scratch(kWork, keptApart ? keptAt.bytes() : 0);
    // Step 1: chunk c of every destination slice into its send slot. With gradient rounding (stochastic, error
    // feedback: include/zpccl.h), slice d draws as slice d of hop 0 and owns elements [d s, d s + s) of the
    // residual (s: the slices' stride).
    for (int c = 0; c < chunks.chunks; ++c) {
      for (int s = 0; s < n; ++s) {
        const int d = qgz_.sliceOfSlot[s];
        const size_t e = chunks.elems(c);
        unsigned char* slot = keptApart && d == rank_ ? kept.data() + keptAt.offset(c)
                                                      : send.data() + sendAt.offset(c) + s * sendAt.slotBytes(c);
        const char* in = static_cast<const char*>(a.sendbuff) + (d * a.count + chunks.offset(c)) * esz;
        if (a.grad.any()) {
          quantizeGradRef(in, a.type, e, a.bits, a.blockSize,
                          gradQuant(a, 0, d, a.count, chunks.offset(c), a.grad.residual), slot);
        } else {
          quantizeRef(in, a.type, e, a.bits, a.blockSize, slot);
        }
      }
    }
    size_t largest = 0;
    for (int c = 0; c < chunks.chunks; ++c) largest = std::max(largest, chunks.elems(c));
    std::vector<float> sum(largest);
    std::vector<const unsigned char*> sources;
    // This rank's slice of chunk c: the sum of `sources`, divided and rounded into `out`.
    auto finish = [&](int c) {
      const size_t e = chunks.elems(c);
      sumPayloadsRef(sources, e, a.bits, a.blockSize, 0, e, sum.data());
      finishRef(sum.data(), a.type, divisor, 0, e, static_cast<char*>(a.recvbuff) + chunks.offset(c) * esz);
    };
    Received got;
    if (p.path != PlanPath::kTwoHops) {
      // One hop, among every rank: slot r of every rank's chunk c goes to rank r, which sums them in rank order.
      ZPCHECK(transport_->allToAll(world(), send.data(), hopChunks(chunks, sendAt, 1), receiveSpace(sendAt.bytes()),
                                   sig, a.opName, &got));
      for (int c = 0; c < chunks.chunks; ++c) {
        sources.clear();
        for (int r = 0; r < topo_.nranks; ++r) {
          sources.push_back(keptApart && r == rank_ ? kept.data() + keptAt.offset(c) : got.block(c, r));
        }
        finish(c);
      }
      return transport_->endExchange(a.opName);
    }
    // Step 2 (hop 1, inside the node): from each local peer l, in local order, the N slots of chunk c meant for this
    // local rank; sum them per destination node b and requantize each partial sum into slot b of chunk c. Partial b
    // draws as slice b of hop 1 and feeds back through its part of the hop residual.
    const int N = qgz_.nodes, L = qgz_.localSize;
    ZPCHECK(transport_->allToAll(intra(), send.data(), hopChunks(chunks, sendAt, N), receiveSpace(sendAt.bytes()), sig,
                                 a.opName, &got));
    const ChunkRegion partialAt(chunks, N, a.bits, a.blockSize);
    std::vector<unsigned char>& partial = scratch(kWork, partialAt.bytes());
    for (int c = 0; c < chunks.chunks; ++c) {
      const size_t pb = sendAt.slotBytes(c);
      const size_t e = chunks.elems(c);
      for (int b = 0; b < N; ++b) {
        sources.clear();
        for (int l = 0; l < L; ++l) sources.push_back(got.block(c, l) + b * pb);
        sumPayloadsRef(sources, e, a.bits, a.blockSize, 0, e, sum.data());
        unsigned char* slot = partial.data() + partialAt.offset(c) + b * pb;
        if (a.grad.any()) {
          quantizeGradRef(sum.data(), zpFloat32, e, a.bits, a.blockSize,
                          gradQuant(a, 1, b, a.count, chunks.offset(c), a.grad.hopResidual), slot);
        } else {
          quantizeRef(sum.data(), zpFloat32, e, a.bits, a.blockSize, slot);
        }
      }
    }
    ZPCHECK(transport_->endExchange(a.opName));  // hop 1 done: every rank has read its slots
    // Step 3 (hop 2, across nodes): from the rank of this local rank on each node a, in node order, its partial of
    // chunk c for this node.
    ZPCHECK(transport_->allToAll(inter(), partial.data(), hopChunks(chunks, partialAt, 1),
                                 receiveSpace(partialAt.bytes()), nullptr, a.opName, &got));
    for (int c = 0; c < chunks.chunks; ++c) {
      sources.clear();
      for (int node = 0; node < N; ++node) sources.push_back(got.block(c, node));
      finish(c);
    }
    return transport_->endExchange(a.opName);
  }

  // The all-reduce (include/zpccl.h, "Quantized all-reduce"): the two calls of host/all_reduce_shards.h, each
  // planned as it would be alone, as the cuda backend runs them; a count that is not nranks whole shards works in
  // padded copies. The reduce-scatter's first exchange carries the all-reduce's signature, so that ranks whose
  // all-reduces differ (a count that pads to the same shards) are told so.
  zpResult_t quantAllReduce(const CollArgs& a) {
    const size_t esz = typeSize(a.type);
    const size_t padded = allReduceShardCount(a.count, topo_.nranks, a.blockSize) * topo_.nranks;
    void* tensor = a.recvbuff;
    uint16_t* residual = a.grad.residual;
    if (padded != a.count) {
      // Scratch `which` as a copy of `count` elements of `size` bytes at `src`, zeros up to `padded` elements.
      auto padInto = [&](int which, const void* src, size_t size) {
        std::vector<unsigned char>& copy = scratch(which, padded * size);
        memcpy(copy.data(), src, a.count * size);
        memset(copy.data() + a.count * size, 0, (padded - a.count) * size);
        return copy.data();
      };
      tensor = padInto(kAllReduceTensor, a.sendbuff, esz);
      if (residual != nullptr)
        residual = reinterpret_cast<uint16_t*>(padInto(kAllReduceResidual, residual, sizeof(uint16_t)));
    }
    const AllReduceSteps steps = allReduceSteps(a, topo_.nranks, rank_, tensor, residual);
    const CallSignature sig = signatureOf(a);
    ZPCHECK(quantReduceScatter(steps.reduceScatter, planOf(steps.reduceScatter), &sig));
    const CollPlan gather = planOf(steps.gather);
    if (gather.path == PlanPath::kTwoHops) {
      ZPCHECK(gatherTwoHops(steps.gather, gather));
    } else {
      ZPCHECK(quantizedGather(steps.gather, gather, world(), nullptr));
    }
    if (steps.padded) {
      memcpy(a.recvbuff, steps.gather.recvbuff, a.count * esz);
      if (a.grad.residual != nullptr) {
        memcpy(a.grad.residual, steps.reduceScatter.grad.residual, a.count * sizeof(uint16_t));
      }
    }
    return zpSuccess;
  }

  // The all-reduce's gather in two hops (host/coll_plan.h): this rank's payload to the ranks of its local rank (one a
  // node), then the N payloads it holds, in node order, to the ranks of its node; every payload dequantized into its
  // shard, run by run of twoHopGatherSlots as the cuda backend's finish does. In place is safe: the own shard is
  // quantized before anything is written.
  zpResult_t gatherTwoHops(const CollArgs& a, const CollPlan& p) {
    const size_t esz = typeSize(a.type);
    const ChunkPlan& chunks = p.chunks;
    const int N = topo_.nodes, L = topo_.localSize;
    const ChunkRegion oneAt(chunks, 1, a.bits, a.blockSize), nodesAt(chunks, N, a.bits, a.blockSize);
    std::vector<unsigned char>& mine = scratch(kSend, oneAt.bytes());
    for (int c = 0; c < chunks.chunks; ++c) {
      quantizeRef(static_cast<const char*>(a.sendbuff) + chunks.offset(c) * esz, a.type, chunks.elems(c), a.bits,
                  a.blockSize, mine.data() + oneAt.offset(c));
    }
    // Hop 1, across nodes: node b's payload lands in slot b of every chunk of this rank's N-slot region.
    Received got;
    ZPCHECK(transport_->allGather(inter(), mine.data(), oneAt.bytes(), receiveSpace(oneAt.bytes() * N), nullptr,
                                  a.opName, &got));
    std::vector<unsigned char>& held = scratch(kWork, nodesAt.bytes());
    for (int c = 0; c < chunks.chunks; ++c) {
      for (int b = 0; b < N; ++b) {
        memcpy(held.data() + nodesAt.offset(c) + b * nodesAt.slotBytes(c), got.block(0, b) + oneAt.offset(c),
               oneAt.slotBytes(c));
      }
    }
    ZPCHECK(transport_->endExchange(a.opName));
    // Hop 2, inside the node: local rank l's region holds the payloads of the ranks (b, l), b = 0..N-1.
    ZPCHECK(transport_->allGather(intra(), held.data(), nodesAt.bytes(), receiveSpace(nodesAt.bytes() * L), nullptr,
                                  a.opName, &got));
    // Slot l N + b of the region: local rank l's payload from node b.
    auto* recv = static_cast<char*>(a.recvbuff);
    for (const TwoHopGatherSlots::Run& run : twoHopGatherSlots(topo_).runs) {
      for (int j = 0; j < run.count; ++j) {
        const int slot = run.first + j, r = run.rank0 + j * run.stride;
        for (int c = 0; c < chunks.chunks; ++c) {
          dequantizeRef(got.block(0, slot / N) + nodesAt.offset(c) + (slot % N) * nodesAt.slotBytes(c), a.type,
                        chunks.elems(c), a.bits, a.blockSize, recv + (r * a.count + chunks.offset(c)) * esz);
        }
      }
    }
    return transport_->endExchange(a.opName);
  }

  // The GradQuant of slice `slice` of hop `hop` (0: sender, slice = destination rank; 1: intermediate, slice =
  // destination node) from its element `first` on: its random stream and its part of `residual` (slice * stride +
  // first on, as the residuals' layouts, whose slices lie `stride` elements apart).
  GradQuant gradQuant(const CollArgs& a, uint32_t hop, int slice, size_t stride, size_t first,
                      uint16_t* residual) const {
    GradQuant g;
    g.stochastic = a.grad.stochastic;
    g.key = GradRandomKey{a.grad.seed, a.grad.sequence, static_cast<uint32_t>(rank_), hop};
    g.slice = static_cast<uint32_t>(slice);
    g.firstElem = first;
    g.residual = residual != nullptr ? residual + static_cast<size_t>(slice) * stride + first : nullptr;
    return g;
  }

  // Scratch buffers owned by the communicator, grown on demand (the host backend may allocate in a call): what this
  // rank gives to the first exchange, what a call works in between (qgZ's kept slice or partial sums), where a
  // transport that copies puts what it receives, and the all-reduce's padded copies of its tensor and residual.
  enum Scratch { kSend, kWork, kReceive, kAllReduceTensor, kAllReduceResidual, kScratchCount };
  std::vector<unsigned char>& scratch(int which, size_t bytes) {
    if (scratch_[which].size() < bytes) scratch_[which].resize(bytes);
    return scratch_[which];
  }

  // After a failed call whose transport cannot say that it is done with this rank's scratch: the buffers are kept
  // where nothing frees them, for as long as the process lives, and the next call (if any) allocates new ones.
  void abandonScratch() {
    for (auto& s : scratch_) keepForGood(&s);
  }

  std::shared_ptr<HostTransport> transport_;
  const int rank_;
  const Topology topo_;
  const QgzPlan qgz_;
  std::vector<int> allRanks_;
  std::vector<unsigned char> scratch_[kScratchCount];
};

}  // namespace

// Every rank judges the same RankInits the same way; agreeOnInit makes sure that a step failing on one rank only (out
// of memory) fails them all.
zpResult_t hostBackendCreate(std::unique_ptr<HostTransport> transport, int rank, const RankInit& mine, const char* call,
                             Topology* topo, std::unique_ptr<Backend>* backend) {
  zpResult_t res = zpSuccess;
  Topology t;
  std::unique_ptr<Backend> created;
  const std::shared_ptr<HostTransport> tr(std::move(transport));
  try {
    const std::string why = initDisagreement(tr->inits());
    if (!why.empty()) res = ZP_ERR(zpInvalidUsage, "%s : ranks disagree on %s", call, why.c_str());
    if (res == zpSuccess) res = buildTopology(nodeKeysOf(tr->inits()), rank, mine.hpzSize, call, &t);
    if (res == zpSuccess) created = std::make_unique<HostBackend>(tr, t);
  } catch (const std::bad_alloc&) {
    res = ZP_ERR(zpSystemError, "%s : out of host memory", call);
  }
  ZPCHECK(tr->agreeOnInit(res, res == zpSuccess ? std::string() : pendingError(), call));
  *topo = std::move(t);
  *backend = std::move(created);
  return zpSuccess;
}

}  // namespace zp
