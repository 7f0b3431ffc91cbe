#include "host/backend/host_backend.h"

#include <cstring>
#include <string>
#include <vector>

#include "host/dtype.h"
#include "host/qgz_plan.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "host/reduce_ref.h"
#include "src/include/check.h"

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
        return quantAllGather(a);
      case CollKind::kHierAllGather:
        return hierAllGather(a);
      case CollKind::kQuantReduceScatter:
        return quantReduceScatter(a);
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

  // qwZ: quantize the own shard, let every rank read every payload, dequantize all of them in rank order.
  zpResult_t quantAllGather(const CollArgs& a) { return quantizedGather(a, allRanks_); }

  // The quantized gather over `group` (global ranks, in output order): qwZ, and hpZ's quantized mode.
  zpResult_t quantizedGather(const CollArgs& a, const std::vector<int>& group) {
    const size_t pb = quantPayloadBytes(a.count, a.bits, a.blockSize);
    const size_t shardBytes = a.count * typeSize(a.type);
    std::vector<unsigned char>& mine = scratch(0, pb);
    quantizeRef(a.sendbuff, a.type, a.count, a.bits, a.blockSize, mine.data());
    ZPCHECK(world_->exchangeAgreed(rank_, mine.data(), signatureOf(a)));
    for (size_t i = 0; i < group.size(); ++i) {
      dequantizeRef(world_->slot(group[i]), a.type, a.count, a.bits, a.blockSize,
                    static_cast<char*>(a.recvbuff) + i * shardBytes);
    }
    world_->endReads(rank_);
    return world_->barrier(rank_, a.opName);  // peers may still read our payload until here
  }

  // hpZ: copy every hpZ peer's shard, as it is, into its place (or gather them quantized when asked).
  zpResult_t hierAllGather(const CollArgs& a) {
    if (a.bits != 0) return quantizedGather(a, topo_.hpzRanks);
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

  // qgZ, following qgz_plan.h step by step.
  zpResult_t quantReduceScatter(const CollArgs& a) {
    const size_t n = a.count;
    const size_t pb = quantPayloadBytes(n, a.bits, a.blockSize);
    const size_t sliceBytes = n * typeSize(a.type);
    const float divisor = a.op == zpAvg ? static_cast<float>(topo_.nranks) : 1.0f;
    // Step 1: every destination slice quantized into its send slot.
    std::vector<unsigned char>& send = scratch(0, pb * qgz_.nranks);
    // With gradient rounding (stochastic, error feedback: include/zpccl.h), slice d draws as slice d of hop 0 and
    // owns elements [d n, d n + n) of the residual.
    for (int s = 0; s < qgz_.nranks; ++s) {
      const int d = qgz_.sliceOfSlot[s];
      const char* slice = static_cast<const char*>(a.sendbuff) + d * sliceBytes;
      if (a.grad.any()) {
        quantizeGradRef(slice, a.type, n, a.bits, a.blockSize, gradQuant(a, 0, d, a.grad.residual),
                        send.data() + s * pb);
      } else {
        quantizeRef(slice, a.type, n, a.bits, a.blockSize, send.data() + s * pb);
      }
    }
    const int N = qgz_.nodes, L = qgz_.localSize;
    std::vector<unsigned char>& partial = scratch(1, qgz_.twoHop ? pb * N : 0);
    std::vector<float> sum(n);
    std::vector<const unsigned char*> sources;
    ZPCHECK(world_->exchangeAgreed(rank_, send.data(), signatureOf(a)));
    if (!qgz_.twoHop) {
      // One hop: slot `rank` of every rank, summed in rank order.
      for (int r = 0; r < topo_.nranks; ++r) sources.push_back(peerSlot(r, rank_, pb));
      sumPayloadsRef(sources, n, a.bits, a.blockSize, 0, n, sum.data());
      world_->endReads(rank_);
      finishRef(sum.data(), a.type, divisor, 0, n, a.recvbuff);
      return world_->barrier(rank_, a.opName);
    }
    // Step 2 (hop 1): from each local peer l, in local order, the N slots meant for this local rank; sum them
    // per destination node b and requantize each partial sum into slot b.
    for (int b = 0; b < N; ++b) {
      sources.clear();
      for (int l = 0; l < L; ++l)
        sources.push_back(peerSlot(topo_.nodeRanks[topo_.node][l], topo_.localRank * N + b, pb));
      sumPayloadsRef(sources, n, a.bits, a.blockSize, 0, n, sum.data());
      if (a.grad.any()) {
        quantizeGradRef(sum.data(), zpFloat32, n, a.bits, a.blockSize, gradQuant(a, 1, b, a.grad.hopResidual),
                        partial.data() + b * pb);
      } else {
        quantizeRef(sum.data(), zpFloat32, n, a.bits, a.blockSize, partial.data() + b * pb);
      }
    }
    world_->endReads(rank_);
    ZPCHECK(world_->barrier(rank_, a.opName));  // hop 1 done: every rank has read its slots
    ZPCHECK(world_->exchange(rank_, partial.data(), a.opName));
    // Step 3 (hop 2): from the rank of this local rank on each node a, in node order, its partial for our node.
    sources.clear();
    for (int node = 0; node < N; ++node) sources.push_back(peerSlot(topo_.interRanks[node], topo_.node, pb));
    sumPayloadsRef(sources, n, a.bits, a.blockSize, 0, n, sum.data());
    world_->endReads(rank_);
    finishRef(sum.data(), a.type, divisor, 0, n, a.recvbuff);
    return world_->barrier(rank_, a.opName);
  }

  // The GradQuant of slice `slice` of hop `hop` (0: sender, slice = destination rank; 1: intermediate, slice =
  // destination node): its random stream and its part of `residual` (slice * count on, as the residuals' layouts).
  GradQuant gradQuant(const CollArgs& a, uint32_t hop, int slice, uint16_t* residual) const {
    GradQuant g;
    g.stochastic = a.grad.stochastic;
    g.key = GradRandomKey{a.grad.seed, a.grad.sequence, static_cast<uint32_t>(rank_), hop};
    g.slice = static_cast<uint32_t>(slice);
    g.residual = residual != nullptr ? residual + static_cast<size_t>(slice) * a.count : nullptr;
    return g;
  }

  const unsigned char* peerSlot(int peer, int slot, size_t slotBytes) const {
    return static_cast<const unsigned char*>(world_->slot(peer)) + slot * slotBytes;
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
