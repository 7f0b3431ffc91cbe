#include "host/backend/host_backend.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "host/chunk_plan.h"
#include "host/coll_plan.h"
#include "host/dtype.h"
#include "host/qgz_plan.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "host/reduce_ref.h"
#include "src/include/check.h"
#include "src/include/debug.h"

namespace zp {

namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(std::shared_ptr<HostWorld> world, const Topology& topo)
      : world_(std::move(world)), rank_(topo.rank), topo_(topo), qgz_(makeQgzPlan(topo)) {
    for (int r = 0; r < topo.nranks; ++r) allRanks_.push_back(r);
  }

  zpResult_t run(const CollArgs& a) override {
    return guarded(a, [&] { return dispatch(a); });
  }

  // Count 0: the ranks meet only to agree on the call.
  zpResult_t runEmpty(const CollArgs& a) override {
    return guarded(a, [&]() -> zpResult_t {
      ZPCHECK(world_->exchangeAgreed(rank_, nullptr, signatureOf(a)));
      world_->endReads(rank_);
      return world_->barrier(rank_, a.opName);
    });
  }

  zpResult_t reserve(size_t) override { return zpSuccess; }

  zpResult_t asyncError(zpResult_t* error) override {
    *error = world_->failed() ? zpRemoteError : zpSuccess;
    return zpSuccess;
  }

  void interrupt() override { world_->abort(rank_); }

  zpResult_t finalize(bool abort) override {
    if (abort) world_->abort(rank_);
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
  // Runs a call's body so that what this rank published stays valid while a peer may read it: the body ends its
  // reads, and a call that fails (or throws) waits until no rank reads before it returns and the caller may free
  // its buffers or the communicator its scratch. A body that throws leaves its peers waiting for it: it fails the
  // world, so that they wake.
  template <class Body>
  zpResult_t guarded(const CollArgs& a, Body&& body) {
    if (world_->failed()) return ZP_ERR(zpRemoteError, "%s : the communicator %s", a.opName, world_->failure().c_str());
    struct Exit {
      HostWorld& world;
      int rank;
      const char* call;
      bool returned = false;
      zpResult_t res = zpInternalError;
      ~Exit() {
        world.endReads(rank);
        if (!returned) world.fail("failed: rank " + std::to_string(rank) + "'s " + call + " ended with an exception");
        if (!returned || res != zpSuccess) world.waitForReaders();
      }
    } exit{*world_, rank_, a.opName};
    exit.res = body();
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
      case CollKind::kQuantAllGather:
        return quantizedGather(a, planOf(a), allRanks_);
      case CollKind::kHierAllGather:
        return hierAllGather(a, planOf(a));
      case CollKind::kQuantReduceScatter:
        return quantReduceScatter(a, planOf(a));
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
    if (a.kind == CollKind::kQuantReduceScatter) s.op = a.op;
    s.bits = a.bits;
    if (a.bits != 0) s.blockSize = a.blockSize;  // exact hpZ ignores the block size
    return s;
  }

  // The plan of call `a` (host/coll_plan.h), as the cuda backend would choose it on this layout without its link
  // facts (no host shared memory channels, direct loads or green context among threads), logged (INFO COLL). The
  // host walks its path, hops and chunks; the exchanges are the world's (every rank reads the others' published
  // buffers), whatever a hop's NCCL exchange would be.
  CollPlan planOf(const CollArgs& a) const {
    const CollPlan p = planCollective(planFactsOf(topo_, a));
    ZP_INFO(kSubsysColl, "%s : %s", a.opName, p.describe().c_str());
    return p;
  }

  // The quantized gather over `group` (global ranks, in output order): qwZ, and hpZ's quantized mode. Chunk by
  // chunk: the own shard quantized into this rank's buffer, which every rank reads, and every rank's payload
  // dequantized in rank order; the own slot first when the plan works it early.
  zpResult_t quantizedGather(const CollArgs& a, const CollPlan& p, const std::vector<int>& group) {
    const size_t esz = typeSize(a.type);
    const ChunkPlan& chunks = p.chunks;
    const ChunkRegion at(chunks, 1, a.bits, a.blockSize);  // this rank's slot of every chunk
    std::vector<unsigned char>& mine = scratch(0, at.bytes());
    const auto* send = static_cast<const char*>(a.sendbuff);
    auto* recv = static_cast<char*>(a.recvbuff);
    for (int c = 0; c < chunks.chunks; ++c) {
      quantizeRef(send + chunks.offset(c) * esz, a.type, chunks.elems(c), a.bits, a.blockSize,
                  mine.data() + at.offset(c));
    }
    ZPCHECK(world_->exchangeAgreed(rank_, mine.data(), signatureOf(a)));
    // Slot i of chunk c: group member i's payload of it, into its shard's chunk c.
    auto dequantize = [&](int c, int i, const unsigned char* payloads) {
      dequantizeRef(payloads + at.offset(c), a.type, chunks.elems(c), a.bits, a.blockSize,
                    recv + (i * a.count + chunks.offset(c)) * esz);
    };
    if (p.ownEarly()) {
      for (int c = 0; c < chunks.chunks; ++c) dequantize(c, p.rank, mine.data());
    }
    for (int c = 0; c < chunks.chunks; ++c) {
      for (size_t i = 0; i < group.size(); ++i) {
        if (p.ownEarly() && static_cast<int>(i) == p.rank) continue;
        dequantize(c, static_cast<int>(i), static_cast<const unsigned char*>(world_->slot(group[i])));
      }
    }
    world_->endReads(rank_);
    return world_->barrier(rank_, a.opName);  // peers may still read our payload until here
  }

  // hpZ: copy every hpZ peer's shard, as it is, into its place (or gather them quantized when asked).
  zpResult_t hierAllGather(const CollArgs& a, const CollPlan& p) {
    if (p.path != PlanPath::kExact) return quantizedGather(a, p, topo_.hpzRanks);
    const size_t shardBytes = a.count * typeSize(a.type);
    ZPCHECK(world_->exchangeAgreed(rank_, a.sendbuff, signatureOf(a)));
    for (int i = 0; i < topo_.hpzSize; ++i) {
      char* dst = static_cast<char*>(a.recvbuff) + i * shardBytes;
      const void* src = world_->slot(topo_.hpzRanks[i]);
      if (dst != src) memcpy(dst, src, shardBytes);
    }
    world_->endReads(rank_);
    return world_->barrier(rank_, a.opName);
  }

  // qgZ, following qgz_plan.h step by step, chunk by chunk (each chunk covers the same element range of every
  // slice; whole blocks, so the codes, the random draws and the sums are those of whole slices).
  zpResult_t quantReduceScatter(const CollArgs& a, const CollPlan& p) {
    const size_t esz = typeSize(a.type);
    const ChunkPlan& chunks = p.chunks;
    const int n = qgz_.nranks;
    const float divisor = a.op == zpAvg ? static_cast<float>(topo_.nranks) : 1.0f;
    const ChunkRegion sendAt(chunks, n, a.bits, a.blockSize);
    // The kept slice, when the plan works it early, is quantized apart and never read by a peer.
    const bool keptApart = p.ownEarly();
    const ChunkRegion keptAt(chunks, 1, a.bits, a.blockSize);
    std::vector<unsigned char>& send = scratch(0, sendAt.bytes());
    std::vector<unsigned char>& kept = scratch(1, keptApart ? keptAt.bytes() : 0);
    // Step 1: chunk c of every destination slice into its send slot. With gradient rounding (stochastic, error
    // feedback: include/zpccl.h), slice d draws as slice d of hop 0 and owns elements [d n, d n + n) of the
    // residual.
    for (int c = 0; c < chunks.chunks; ++c) {
      for (int s = 0; s < n; ++s) {
        const int d = qgz_.sliceOfSlot[s];
        unsigned char* out = keptApart && d == rank_ ? kept.data() + keptAt.offset(c)
                                                     : send.data() + sendAt.offset(c) + s * sendAt.slotBytes(c);
        const char* in = static_cast<const char*>(a.sendbuff) + (d * a.count + chunks.offset(c)) * esz;
        if (a.grad.any()) {
          quantizeGradRef(in, a.type, chunks.elems(c), a.bits, a.blockSize,
                          gradQuant(a, 0, d, chunks.offset(c), a.grad.residual), out);
        } else {
          quantizeRef(in, a.type, chunks.elems(c), a.bits, a.blockSize, out);
        }
      }
    }
    size_t largest = 0;
    for (int c = 0; c < chunks.chunks; ++c) largest = std::max(largest, chunks.elems(c));
    std::vector<float> sum(largest);
    std::vector<const unsigned char*> sources;
    auto finish = [&](int c) {
      sumPayloadsRef(sources, chunks.elems(c), a.bits, a.blockSize, 0, chunks.elems(c), sum.data());
      finishRef(sum.data(), a.type, divisor, 0, chunks.elems(c),
                static_cast<char*>(a.recvbuff) + chunks.offset(c) * esz);
    };
    ZPCHECK(world_->exchangeAgreed(rank_, send.data(), signatureOf(a)));
    if (p.path != PlanPath::kTwoHops) {
      // One hop: slot `rank` of every rank's chunk c, summed in rank order.
      for (int c = 0; c < chunks.chunks; ++c) {
        sources.clear();
        for (int r = 0; r < topo_.nranks; ++r) {
          sources.push_back(keptApart && r == rank_ ? kept.data() + keptAt.offset(c)
                                                    : peerSlot(r, sendAt.offset(c) + rank_ * sendAt.slotBytes(c)));
        }
        finish(c);
      }
      world_->endReads(rank_);
      return world_->barrier(rank_, a.opName);
    }
    // Step 2 (hop 1): from each local peer l, in local order, the N slots of chunk c meant for this local rank; sum
    // them per destination node b and requantize each partial sum into slot b of chunk c. Partial b draws as slice
    // b of hop 1 and feeds back through its part of the hop residual.
    const int N = qgz_.nodes, L = qgz_.localSize;
    const ChunkRegion partialAt(chunks, N, a.bits, a.blockSize);
    std::vector<unsigned char>& partial = scratch(1, partialAt.bytes());
    for (int c = 0; c < chunks.chunks; ++c) {
      const size_t pb = sendAt.slotBytes(c);
      for (int b = 0; b < N; ++b) {
        sources.clear();
        for (int l = 0; l < L; ++l) {
          sources.push_back(
              peerSlot(topo_.nodeRanks[topo_.node][l], sendAt.offset(c) + (topo_.localRank * N + b) * pb));
        }
        sumPayloadsRef(sources, chunks.elems(c), a.bits, a.blockSize, 0, chunks.elems(c), sum.data());
        unsigned char* out = partial.data() + partialAt.offset(c) + b * pb;
        if (a.grad.any()) {
          quantizeGradRef(sum.data(), zpFloat32, chunks.elems(c), a.bits, a.blockSize,
                          gradQuant(a, 1, b, chunks.offset(c), a.grad.hopResidual), out);
        } else {
          quantizeRef(sum.data(), zpFloat32, chunks.elems(c), a.bits, a.blockSize, out);
        }
      }
    }
    world_->endReads(rank_);
    ZPCHECK(world_->barrier(rank_, a.opName));  // hop 1 done: every rank has read its slots
    ZPCHECK(world_->exchange(rank_, partial.data(), a.opName));
    // Step 3 (hop 2): from the rank of this local rank on each node a, in node order, its partial of chunk c for
    // this node.
    for (int c = 0; c < chunks.chunks; ++c) {
      sources.clear();
      for (int node = 0; node < N; ++node) {
        sources.push_back(peerSlot(topo_.interRanks[node], partialAt.offset(c) + topo_.node * partialAt.slotBytes(c)));
      }
      finish(c);
    }
    world_->endReads(rank_);
    return world_->barrier(rank_, a.opName);
  }

  // The GradQuant of slice `slice` of hop `hop` (0: sender, slice = destination rank; 1: intermediate, slice =
  // destination node) from its element `first` on: its random stream and its part of `residual` (slice * count +
  // first on, as the residuals' layouts).
  GradQuant gradQuant(const CollArgs& a, uint32_t hop, int slice, size_t first, uint16_t* residual) const {
    GradQuant g;
    g.stochastic = a.grad.stochastic;
    g.key = GradRandomKey{a.grad.seed, a.grad.sequence, static_cast<uint32_t>(rank_), hop};
    g.slice = static_cast<uint32_t>(slice);
    g.firstElem = first;
    g.residual = residual != nullptr ? residual + static_cast<size_t>(slice) * a.count + first : nullptr;
    return g;
  }

  // The bytes at `offset` of what `peer` published for this exchange.
  const unsigned char* peerSlot(int peer, size_t offset) const {
    return static_cast<const unsigned char*>(world_->slot(peer)) + offset;
  }

  // Scratch buffers owned by the communicator, grown on demand (the host backend may allocate in a call).
  std::vector<unsigned char>& scratch(int which, size_t bytes) {
    if (scratch_[which].size() < bytes) scratch_[which].resize(bytes);
    return scratch_[which];
  }

  std::shared_ptr<HostWorld> world_;
  const int rank_;
  const Topology topo_;
  const QgzPlan qgz_;
  std::vector<int> allRanks_;
  std::vector<unsigned char> scratch_[2];
};

}  // namespace

zpResult_t hostBackendCreate(const zpUniqueId& id, int nranks, int rank, const RankInit& mine, const char* call,
                             Topology* topo, std::unique_ptr<Backend>* backend) {
  std::shared_ptr<HostWorld> world;
  ZPCHECK(HostWorld::join(id, nranks, rank, mine, call, WorldTimeouts::fromParams(), &world));
  // Every rank judges the same RankInits the same way; agreeOnInit makes sure that a step failing on one rank
  // only (out of memory) fails them all.
  zpResult_t res = zpSuccess;
  Topology t;
  std::unique_ptr<Backend> created;
  try {
    const std::string why = initDisagreement(world->inits());
    if (!why.empty()) res = ZP_ERR(zpInvalidUsage, "%s : ranks disagree on %s", call, why.c_str());
    if (res == zpSuccess) res = buildTopology(nodeKeysOf(world->inits()), rank, mine.hpzSize, call, &t);
    if (res == zpSuccess) created = std::make_unique<HostBackend>(world, t);
  } catch (const std::bad_alloc&) {
    res = ZP_ERR(zpSystemError, "%s : out of host memory", call);
  }
  ZPCHECK(world->agreeOnInit(rank, res, res == zpSuccess ? std::string() : pendingError(), call));
  *topo = std::move(t);
  *backend = std::move(created);
  return zpSuccess;
}

}  // namespace zp
