// The plan of one collective call, chosen once from facts before anything runs, as NCCL chooses an algorithm,
// protocol and channel count from a table (its getAlgoInfo) and predicts the call's time from the same table.
// Facts in (the layout, the tunables' values, what the links and the direct-load window allow, the call), plan out
// (the path, the chunk schedule, each hop's exchange, where the slot that never crosses a link is worked, the
// green context, the receive slots and the memory it needs), with no side effects: the cuda backend executes the
// plan, the host backend walks it, the cost model (tools/model) prices it, and the host-only tests assert it.
//
// The paths:
// - direct: among the ranks of one NVLink domain, qwZ, hpZ with bits over the whole communicator and one-hop qgZ
//   of at least ZP_DIRECT_MIN_BYTES read the peers' payloads from their memory (src/cuda/peer_window.h), when the
//   direct-load window holds the call's payloads or can still grow to (a CUDA graph freezes it);
// - one hop: the chunk pipeline with one exchange among every rank of the group (the gathers' all-gather; qgZ's
//   all-to-all on one node, or across nodes of one rank each);
// - two hops: qgZ on several nodes of several ranks each, all equal (host/qgz_plan.h);
// - flat: qgZ's one hop where uneven nodes rule out the two (init's log says so);
// - exact: hpZ without bits, one all-gather of the secondary shards as they are, not chunked.
// The all-reduce (zpQuantAllReduce) is two calls (host/all_reduce_shards.h), each planned as a call of its own: qgZ's
// reduce-scatter of its shards, then the gather of the reduced shards in qwZ's format (PlanFacts::allReduceGather),
// whose path is qwZ's but where nodes hold several ranks each: two hops, across nodes then inside the node, in the
// reverse order of qgZ's (include/zpccl.h says what that saves).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "host/base/backend.h"
#include "host/chunk_plan.h"
#include "host/topology.h"

namespace zp {

// The values of the tunables that shape a plan (host/base/params.h has each one's meaning and range).
struct PlanTunables {
  int64_t chunkBytes = 0;             // ZP_CHUNK_BYTES (0: kDefaultChunkBytes)
  int64_t maxChunks = 0;              // ZP_MAX_CHUNKS (at most kMaxPipelineChunks are planned)
  bool chunkRamp = false;             // ZP_CHUNK_RAMP
  int64_t pairAllGather = 0;          // ZP_PAIR_ALLGATHER: 0 never, 1 always, 2 over a slow link
  int64_t directMinBytes = -1;        // ZP_DIRECT_MIN_BYTES (< 0: never)
  int64_t directInlineWaitBytes = 0;  // ZP_DIRECT_INLINE_WAIT_BYTES
  int64_t ownSlotEarlyBytes = -1;     // ZP_OWN_SLOT_EARLY_BYTES (< 0: never)

  // The values the environment gives (each tunable read once and cached).
  static PlanTunables fromParams();
};

// What the links between the ranks allow (the cuda backend's facts; the host backend has none of them).
struct LinkFacts {
  bool shmChannels = false;   // one node whose GPUs talk through host shared memory, on ZP_SHM_MIN_CTAS channels
  bool directLoads = false;   // every rank (one node) can load every other's memory: agreed at init, alike on all
  bool greenContext = false;  // a green context leaves ZP_NCCL_SMS SMs to NCCL (src/cuda/green_context.h)
};

// The direct-load window as the caller knows it before the call (src/cuda/peer_window.h).
struct WindowFacts {
  size_t bytes = 0;          // its size now
  bool frozen = false;       // a CUDA graph holds it: it never grows again
  size_t payloadOffset = 0;  // its flags' bytes, before the payload
};

struct PlanFacts {
  const Topology* topo = nullptr;  // the layout seen by the calling rank
  PlanTunables tunables;
  LinkFacts link;
  WindowFacts window;
  CollKind kind = CollKind::kQuantAllGather;  // one of the collectives
  size_t count = 0;                           // sendcount (the gathers) or recvcount (qgZ), elements
  size_t elemBytes = 0;
  int bits = 0;                  // 0: exact hpZ
  int blockSize = 0;             // unused by exact hpZ
  bool inPlace = false;          // named in the log; every path is safe in place (a chunk is read before it is written)
  bool allReduceGather = false;  // kQuantAllGather as an all-reduce's second call (CollArgs::allReduceGather)
};

// (The enumerations below are named in this order by coll_plan.cc's tables.)
enum class PlanPath { kNone, kDirect, kOneHop, kTwoHops, kFlat, kExact };

// The communicator a hop runs on (the cuda backend's NcclComms; the host backend's groups of ranks).
enum class PlanComm { kWorld, kIntra, kInter, kHpz };

// How a hop moves each chunk's slots among its peers.
enum class Exchange {
  kAllGather,   // the gathers: one all-gather of every rank's slot, each rank's gathered in place
  kSendRecv,    // a send and a receive with every peer (this rank included unless withoutSelf)
  kPairGather,  // two ranks: one all-gather of the slot each sends the other, then a local copy of the kept slot
  // Two ranks whose kept slot is worked early (qgZ's pair layout): the slot for the peer is quantized into the
  // middle one of three receive slots and gathered in place, so that the peer's lands beside it; no copy.
  kPairGatherInPlace,
};

struct HopPlan {
  Exchange exchange = Exchange::kSendRecv;
  PlanComm comm = PlanComm::kWorld;
  int peers = 0;               // ranks exchanging, this one included
  int self = 0;                // this rank's index among them
  int slotsPerPeer = 1;        // payload slots (a chunk's each) sent to every peer: N for two hops' first
  bool withoutSelf = false;    // kSendRecv: this rank's own slot is not sent (it is worked early)
  bool onFinishStage = false;  // run by the finish stage (two hops' second), else by the move stage
};

// Where the slot that never crosses a link (the gathers' own shard, qgZ's kept slice) is worked.
enum class OwnSlot {
  kWithTheOthers,  // like every other slot: through the exchange
  kFinishStage,    // early, on the finish stage while the first chunk travels (pipelined calls)
  kSideStream,     // early, on a side stream beside the exchange (calls of one chunk, whose kernels are exposed)
};

// The receive slots of a pipelined qgZ call, a chunk's each (scratch 1).
struct RecvLayout {
  int slots = 0;         // n, or kPairLayoutSlots
  int keptSlot = -1;     // where the kept slice is quantized when it is worked early; -1 otherwise
  int sourceStride = 1;  // slots between the sum's sources (rank order): 2 in the pair layout
};
constexpr int kPairLayoutSlots = 3;

// The most exchanges a plan makes (two hops).
constexpr int kMaxHops = 2;

struct CollPlan {
  CollKind kind = CollKind::kQuantAllGather;
  PlanPath path = PlanPath::kNone;
  PlanComm group = PlanComm::kWorld;  // the ranks of the call: the world, or the hpZ group
  int ranks = 0;                      // in the group
  int rank = 0;                       // this rank's index in it
  size_t logicalBytes = 0;            // the call's unquantized bytes: count x ranks x element bytes
  bool inPlace = false;
  ChunkPlan chunks;  // one chunk for the direct and exact paths
  int hops = 0;
  HopPlan hop[kMaxHops];  // in the order they run
  OwnSlot ownSlot = OwnSlot::kWithTheOthers;
  bool greenStages = false;  // the quantize and finish stages run in the green context
  bool ownInGreen = false;   // the own slot's kernels run in the green context
  bool inlineWaits = false;  // direct: the kernels wait for the peers themselves (no extra launches)
  int sendSlots = 0;         // payload slots a chunk in scratch 0 (every rank's, or every destination's)
  RecvLayout recv;           // qgZ's pipelines; slots 0 for the others
  size_t scratchBytes[2] = {0, 0};
  size_t windowBytes = 0;  // direct: the window's size the call needs, its flags included

  bool pipelined() const { return chunks.chunks > 1; }
  bool ownEarly() const { return ownSlot != OwnSlot::kWithTheOthers; }
  // One line for the log (INFO COLL), naming every decision.
  std::string describe() const;
};

// The plan of one call. facts.topo must be set and facts.kind be a collective (not zpQuantize/zpDequantize).
CollPlan planCollective(const PlanFacts& facts);

// The facts of call `a` that every backend knows: `topo` (kept by pointer), the tunables' values from the
// environment, the call's shape and whether its buffers are in NCCL's in-place layout (the gathers' sendbuff at
// this rank's place in recvbuff, hpZ's at its hpZ rank's; qgZ's recvbuff at this rank's slice of sendbuff). The
// links and the window are left as none: the backend that has them sets them.
PlanFacts planFactsOf(const Topology& topo, const CollArgs& a);

// The chunk schedule of a pipelined call of `count` elements a rank moving `logicalBytes` in all.
ChunkPlan planChunks(const PlanTunables& t, size_t count, int blockSize, size_t logicalBytes);

// What zpCommReserve(maxBytes) sizes: scratch for every plan of up to maxBytes logical bytes at the worst
// settings a call may ask for (8 bits, 2-byte types, the smallest block; for the all-reduce, whose shards round up
// to whole blocks, the block size that needs most), and the direct-load window for qgZ's n slots of such a call
// when direct loads would serve it (0 otherwise).
struct ReservePlan {
  size_t scratchBytes[2] = {0, 0};
  size_t windowBytes = 0;
};
ReservePlan planReserve(const Topology& topo, const PlanTunables& t, const LinkFacts& link, size_t payloadOffset,
                        size_t maxBytes);

// The slots of a chunk's region in the all-reduce's two-hop gather (planGatherTwoHops): slot l N + b holds the
// payload of local rank l of node b, so that both all-gathers run in place; `mySlot` is this rank's. A finish
// dequantizes the region run by run: slots [first, first + count) are the payloads of ranks rank0, rank0 + stride,
// ..., one run a local rank where its ranks are evenly spaced (ranks numbered node by node, or interleaving), else
// one a slot.
struct TwoHopGatherSlots {
  struct Run {
    int first = 0, count = 0, rank0 = 0, stride = 1;
  };
  int mySlot = 0;
  std::vector<Run> runs;
};
TwoHopGatherSlots twoHopGatherSlots(const Topology& t);

const char* planPathName(PlanPath p);
const char* exchangeName(Exchange x);
const char* planCommName(PlanComm c);
const char* ownSlotName(OwnSlot o);
// The names above, for logs and test messages.
std::ostream& operator<<(std::ostream& out, PlanPath p);
std::ostream& operator<<(std::ostream& out, Exchange x);
std::ostream& operator<<(std::ostream& out, PlanComm c);
std::ostream& operator<<(std::ostream& out, OwnSlot o);

}  // namespace zp
