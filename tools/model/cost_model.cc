#include "tools/model/cost_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "host/chunk_plan.h"
#include "host/coll_plan.h"
#include "host/quant_format.h"
#include "host/topology.h"

namespace zp {

LinkParams LinkParams::uniform(double bwGBs, double latencyUs) {
  LinkParams p;
  p.allGather = p.reduceScatter = p.allToAll = LinkCost{bwGBs, latencyUs};
  return p;
}

LinkCost LinkCost::forSize(double size, double stepBytes) const {
  const LinkCost large{bwGBs, latencyUs}, small{smallBwGBs, smallLatencyUs};
  if (!hasSmallLine() || !(size < smallBelowBytes)) return large;
  const double x = stepBytes * 1e-3;  // bytes at GB/s = 1e3 B/us
  return small.latencyUs + x / small.bwGBs < large.latencyUs + x / large.bwGBs ? small : large;
}

ClusterSpec ClusterSpec::even(int nodes, int gpusPerNode) {
  ClusterSpec c;
  c.gpusPerNode.assign(std::max(nodes, 0), gpusPerNode);
  return c;
}

int ClusterSpec::nranks() const {
  int n = 0;
  for (int g : gpusPerNode) n += g;
  return n;
}

bool ClusterSpec::isEven() const {
  for (int g : gpusPerNode)
    if (g != gpusPerNode.front()) return false;
  return true;
}

Traffic& Traffic::operator+=(const Traffic& o) {
  intraBytes += o.intraBytes;
  interBytes += o.interBytes;
  nodeEgressBytes += o.nodeEgressBytes;
  kernelBytes += o.kernelBytes;
  launches += o.launches;
  linkUs += o.linkUs;
  latencyUs += o.latencyUs;
  kernelUs += o.kernelUs;
  hiddenUs += o.hiddenUs;
  return *this;
}

Traffic Traffic::scaled(double k) const {
  Traffic t = *this;
  t.intraBytes *= k;
  t.interBytes *= k;
  t.nodeEgressBytes *= k;
  t.kernelBytes *= k;
  t.launches *= k;
  t.linkUs *= k;
  t.latencyUs *= k;
  t.kernelUs *= k;
  t.hiddenUs *= k;
  return t;
}

namespace {

// The layout from the library's own topology code, as rank 0 sees it; false when it has no rank.
bool topologyOf(const ClusterSpec& c, int hpzRequest, Topology* t) {
  std::vector<uint64_t> keys;
  for (size_t node = 0; node < c.gpusPerNode.size(); ++node)
    for (int g = 0; g < c.gpusPerNode[node]; ++g) keys.push_back(1000 + node);
  for (int g : c.gpusPerNode)
    if (hpzRequest > 0 && g % hpzRequest != 0) hpzRequest = 0;  // validate() reports it; never log from here
  return !keys.empty() && buildTopology(keys, 0, hpzRequest, "zpccl-model", t) == zpSuccess;
}

// hpZ's groups (rank 0's view).
struct LayoutFacts {
  bool hpzUsable = false;
  int hpzSize = 1;
};

LayoutFacts layoutFacts(const ClusterSpec& c, int hpzRequest) {
  LayoutFacts f;
  Topology t;
  if (!topologyOf(c, hpzRequest, &t)) return f;
  f.hpzUsable = t.hpzUsable;
  f.hpzSize = t.hpzSize;
  return f;
}

bool isPair(Exchange x) { return x == Exchange::kPairGather || x == Exchange::kPairGatherInPlace; }

// Whether qgZ's plan on this layout exchanges any slots by a pair's all-gather (one hop over two ranks, or two hops
// with two GPUs a node or two nodes).
bool qgzPairGathers(const ClusterSpec& c, double recvcount, int e, int bits, int blockSize) {
  const CollPlan plan = planOf(c, CollKind::kQuantReduceScatter, recvcount, e, bits, blockSize);
  for (int h = 0; h < plan.hops; ++h)
    if (isPair(plan.hop[h].exchange)) return true;
  return false;
}

// ===========================================================================================================
// The formulas. Every time and byte count of the model comes from this section; calibrate() fits its parameters
// (steps in tools/model/cost_model.h).
//
//   n ranks on N nodes, node a holding L_a GPUs (L when even); S the logical bytes of a collective; e the bytes
//   per element; pb(k) = quantPayloadBytes(k, bits, G): fp32 scales of ceil(k/G) blocks padded to 16 bytes, then
//   the packed codes padded to 16 bytes (host/quant_format.h). t(x, B) = x / B.
//
//   Links (NCCL). B_intra: bus bandwidth of a GPU's intra-node links; B_inter: bus bandwidth of a node's NICs
//   together; alpha: cost per step; each per kind of collective (all-gather, reduce-scatter, all-to-all). A step
//   of x bytes costs alpha + x / B, i.e. it runs at B * x / (x + alpha * B): alpha models NCCL's bandwidth ramp
//   (half speed at x = alpha * B), fitted from 16 MiB up, and is not the small-message latency. Below that range
//   NCCL switches to its small-message protocols and the line over-predicts it, so a link may also carry a
//   small-message line (alpha_s, B_s), fitted the same way from the NCCL rows below 16 MiB (two H200: 1 and 4 MiB):
//   a collective of nccl-tests size S' below the large fit's smallest size (16 MiB) costs the lower of the two
//   lines, NCCL picking the protocol its tuning predicts faster (LinkCost::forSize, compared per step). S' is the
//   gathered tensor of an all-gather, the input of a reduce-scatter, n*p for an all-to-all among n (p a peer).
//   Ring all-gather / reduce-scatter (NCCL), S = gathered tensor / each rank's input:
//     every rank sends (n-1)/n * S (n-1 steps of S/n). One node: all of it on NVLink.
//     Several nodes: every ring (channel) leaves each node once, so (n-1)/n * S leaves every node
//     (node egress), N of the ring's n hops cross nodes: inter per GPU = (n-1)/n * S * N/n, the rest is intra.
//     time = (n-1) * alpha_link + max(t(egress, B_inter), t(intra per GPU, B_intra)), where alpha_link is
//     the inter-node one when the ring crosses nodes (each step waits for its slowest hop).
//   All-to-all, p bytes to each peer: a GPU of node a sends p*(L_a-1) intra and p*(n-L_a) inter; node a's
//     egress is L_a*p*(n-L_a). time = (n-1) * alpha + max over nodes of the two transfer times.
//
//   Kernels, each kind at its own speed: time = launches * launchUs + work / rate.
//     quantize (k*e -> pb(k)), dequantize (pb(k) -> k*e): work = bytes read + written, rate in GB/s. Quantize has
//       a cost per code width, Q_b (quantizeCost(bits)), wherever it runs (qwZ, qgZ, the quantize rows).
//       Dequantize one for both (its widths agree within the fit's error).
//     copy (NCCL's all-gather over one rank, out of place): work = 2 * bytes (read + written), GB/s.
//     reduce (device/reduce.cu: dequantize + fp32 sum of s sources of k elements, then finish or requantize): one
//       CTA per quantization block, each thread loading one 16- or 32-bit word of codes per source per 4
//       elements: its time follows the elements it decodes, not the bytes, so work = s * k element-sources
//       (whatever the bits), rate in G element-sources/s, fitted from the qgZ rows; launchUs = dequantize's.
//
//   Chunk pipelines (qwZ, qgZ; src/cuda/pipeline.h), on the library's plan of the call (planOf, host/coll_plan.h):
//     its path, its chunks and each hop's exchange. The shard (qwZ) or every slice (qgZ) is cut into
//     C = min(max(1, logical bytes / 64 MiB), 8) chunks of whole blocks (host/chunk_plan.h); three stages run
//     chunk after chunk on three streams: quantize (Q), move (M: NCCL on the caller's stream), finish (F). Q, M,
//     F are each stage's time summed over the chunks (every chunk's kernels and NCCL calls with their own
//     launch and per-step costs) and sum = Q + M + F. An ideal pipeline of C equal chunks takes
//     ideal = sum / C + (C-1)/C * max(Q, M, F); the stages share the GPU's memory bandwidth and SMs (NVLink
//     traffic is memory traffic too), so the implementation hides only a share w of that:
//       time = sum - hidden,  hidden = w * (sum - ideal)   (C = 1: one stream, time = sum)
//     with w fitted per op from its rows (perf/RESULTS.md, Cost model), and for qwZ per configuration: its
//     kernels on every SM (ZP_NCCL_SMS=0) or in a green context that leaves SMs to NCCL (the library's
//     default, ZP_NCCL_SMS=32), with the same kernel rates (PipelineParams). Where the link dominates
//     (max = M or the second hop), sum - ideal is small against the time and w barely matters. A call of one chunk
//     runs all of it on the caller's stream, back to back, without events (beginPipeline): time = Q + M + F
//     exactly. Its NCCL call moves payloads, a quarter (int4) or half (int8) of the logical bytes: at 16 MiB
//     logical that is below the 16 MiB from which the large lines are fitted, where the small-message line
//     applies where it is lower (over NVLink, qgZ int4's 4 MiB all-to-all is priced far closer to what NCCL
//     runs by the small line than by the large one).
//   qwZ (count k per rank), per chunk of k_c elements:
//     Q: quantize k_c*e -> pb(k_c) (1 launch);  M: ring all-gather of n*pb(k_c) bytes;
//     F: dequantize n*pb(k_c) -> n*k_c*e (1 launch).
//   qgZ (recvcount k; a rank's input is n*k elements, n slices), per chunk of k_c elements of every slice:
//     Q: quantize n*k_c*e -> n*pb(k_c) (1 launch; L launches for two hops, one per local peer's slots).
//     one hop (one node, one GPU per node, or uneven nodes): M: all-to-all, pb(k_c) to each of the n-1 peers;
//       F: reduce of n sources into k_c*e.
//     two hops (N nodes of L > 1 GPUs, qgz_plan.h): M: all-to-all inside the node, N*pb(k_c) to each of the L-1
//       local peers (intra (L-1)*N*pb), then reduce + requantize of N partials of L sources (L*N*k_c
//       element-sources, writes N*pb); F: all-to-all among the N ranks of one local rank (L such groups at
//       once): inter (N-1)*pb per GPU, node egress L*(N-1)*pb; then reduce of N sources into k_c*e.
//     pair exchanges (the plan's Exchange::kPairGather, ZP_PAIR_ALLGATHER = PipelineParams::pairAllGather): an
//       all-to-all between exactly two ranks (one hop over n = 2; hop 1 with L = 2; hop 2 with N = 2) runs, when
//       the plan says so (mode 1 always, 2 when the two are on different nodes: one hop over two nodes, and hop 2),
//       as one NCCL all-gather of the slot each rank sends the other: the same bytes and steps, priced on the
//       all-gather line of that link instead of the all-to-all one, plus a copy of the p-byte slot the rank keeps
//       (2p read + written, one launch, KernelParams::copy) on the same stream (none in the pair layout, whose kept
//       slot is worked early: not in the model's plans). Over sockets the gather runs at the ring's speed, faster
//       than the point-to-point's (perf/RESULTS.md, qgZ net).
//   hpZ (full tensor of T*e bytes), groups of h ranks of one node: ring all-gather of T*e inside the group:
//     (h-1)/h * T*e intra per GPU, (h-1) intra steps, nothing across nodes, no kernel. h = 1 (one GPU per node,
//     or hpzSize 1): the secondary shard is the whole tensor and NCCL's one-rank all-gather copies it: a copy of
//     T*e bytes (nothing when called in place). Uneven layout: unavailable, the flat ring all-gather instead.
//   ZeRO-3: ring all-gather forward and backward (S = the parameters x e), ring reduce-scatter of gradients.
//
//   Step: comm = forward + backward + gradient; step = compute + comm - overlap * min(compute, comm)
//   (overlap 0: compute + comm; 1: max(compute, comm)).
// ===========================================================================================================

double transferUs(double bytes, double bwGBs) { return bytes > 0 ? bytes / (bwGBs * 1e3) : 0.0; }  // GB/s = 1e3 B/us

// `launches` launches of one kind of kernel doing `work` (see KernelCost), reading + writing `bytes`.
void addKernel(const KernelCost& k, double launches, double work, double bytes, Traffic* t) {
  t->launches += launches;
  t->kernelBytes += bytes;
  t->kernelUs += launches * k.launchUs + transferUs(work, k.rate);  // G units/s = 1e3 units/us
}

double payloadBytes(double count, int bits, int blockSize) {
  return static_cast<double>(quantPayloadBytes(static_cast<size_t>(std::ceil(count)), bits, blockSize));
}

Traffic ringCost(const ClusterSpec& c, double S, LinkCost LinkParams::*kind) {
  Traffic t;
  const int n = c.nranks(), N = c.nodes();
  if (n <= 1 || S <= 0) return t;
  const double perRank = (n - 1.0) / n * S;
  const LinkCost in = (c.intra.*kind).forSize(S, S / n), out = (c.inter.*kind).forSize(S, S / n);
  if (N == 1) {
    t.intraBytes = perRank;
    t.linkUs = transferUs(perRank, in.bwGBs);
    t.latencyUs = (n - 1) * in.latencyUs;
    return t;
  }
  t.nodeEgressBytes = perRank;
  t.interBytes = perRank * N / n;
  t.intraBytes = perRank - t.interBytes;
  t.linkUs = std::max(transferUs(t.nodeEgressBytes, out.bwGBs), transferUs(t.intraBytes, in.bwGBs));
  t.latencyUs = (n - 1) * out.latencyUs;
  return t;
}

// The local copy that follows a pair's all-gather exchange: the p-byte slot the rank keeps, read + written (none
// when the pair's layout gathers in place).
void addPairCopy(const ClusterSpec& c, Exchange x, double p, Traffic* t) {
  if (x == Exchange::kPairGather) addKernel(c.kernel.copy, 1, 2 * p, 2 * p, t);
}

// qgZ hop 1: all-to-all inside every node (groups of L), p bytes to each local peer; a pair (L = 2) that gathers
// (the plan's exchange x) on the all-gather line, plus its copy.
Traffic intraExchange(const ClusterSpec& c, int L, double p, Exchange x) {
  Traffic t;
  if (L <= 1) return t;
  const bool gather = isPair(x);
  const LinkCost link = (gather ? c.intra.allGather : c.intra.allToAll).forSize(L * p, p);
  t.intraBytes = (L - 1) * p;
  t.linkUs = transferUs(t.intraBytes, link.bwGBs);
  t.latencyUs = (L - 1) * link.latencyUs;
  addPairCopy(c, x, p, &t);
  return t;
}

// qgZ hop 2: L all-to-alls at once, each among the N ranks of one local rank, p bytes to each peer; two nodes that
// gather (the plan's exchange x) on the all-gather line, plus the copy.
Traffic interExchange(const ClusterSpec& c, int N, int L, double p, Exchange x) {
  Traffic t;
  if (N <= 1) return t;
  const bool gather = isPair(x);
  const LinkCost link = (gather ? c.inter.allGather : c.inter.allToAll).forSize(N * p, p);
  t.interBytes = (N - 1) * p;
  t.nodeEgressBytes = L * t.interBytes;
  t.linkUs = transferUs(t.nodeEgressBytes, link.bwGBs);
  t.latencyUs = (N - 1) * link.latencyUs;
  addPairCopy(c, x, p, &t);
  return t;
}

// qgZ's one hop: the all-to-all over every rank, p bytes to each peer; two ranks that gather (the plan's exchange
// x) run NCCL's ring all-gather of the two slots (each rank sends p), plus the copy.
Traffic oneHopExchange(const ClusterSpec& c, double p, Exchange x) {
  if (!isPair(x)) return allToAllCost(c, p);
  Traffic t = ringAllGatherCost(c, 2 * p);
  addPairCopy(c, x, p, &t);
  return t;
}

// The three stages of a chunk pipeline, each summed over the chunks.
struct Stages {
  Traffic quantize, move, finish;
  int chunks = 0;
  double sumUs() const { return quantize.timeUs() + move.timeUs() + finish.timeUs(); }
  // sum - ideal: what an ideal pipeline of `chunks` equal chunks would hide.
  double idealHiddenUs() const {
    if (chunks <= 1) return 0;
    const double q = quantize.timeUs(), m = move.timeUs(), f = finish.timeUs();
    const double sum = q + m + f;
    return sum - (sum / chunks + (chunks - 1.0) / chunks * std::max({q, m, f}));
  }
  Traffic total(double overlap) const {
    Traffic t = quantize;
    t += move;
    t += finish;
    t.hiddenUs += overlap * idealHiddenUs();
    return t;
  }
};

// qwZ's stages (the gather of the plan, `plan`: one hop over every rank).
Stages qwzStages(const ClusterSpec& c, const CollPlan& plan, int e, int bits, int blockSize) {
  Stages s;
  const int n = plan.ranks;
  const ChunkPlan& chunks = plan.chunks;
  s.chunks = chunks.chunks;
  for (int i = 0; i < chunks.chunks; ++i) {
    const double k = static_cast<double>(chunks.elems(i)), pb = payloadBytes(k, bits, blockSize);
    addKernel(c.kernel.quantizeCost(bits), 1, k * e + pb, k * e + pb, &s.quantize);
    s.move += ringAllGatherCost(c, n * pb);
    addKernel(c.kernel.dequantize, 1, n * pb + n * k * e, n * pb + n * k * e, &s.finish);
  }
  return s;
}

// qgZ's stages on the path of `plan`: one hop (or one flat hop), or two.
Stages qgzStages(const ClusterSpec& c, const CollPlan& plan, int e, int bits, int blockSize) {
  Stages s;
  const int n = plan.ranks;
  const bool twoHop = plan.path == PlanPath::kTwoHops;
  const int L = twoHop ? plan.hop[0].peers : n, N = twoHop ? plan.hop[1].peers : 1;
  const ChunkPlan& chunks = plan.chunks;
  s.chunks = chunks.chunks;
  for (int i = 0; i < chunks.chunks; ++i) {
    const double k = static_cast<double>(chunks.elems(i)), pb = payloadBytes(k, bits, blockSize);
    addKernel(c.kernel.quantizeCost(bits), twoHop ? L : 1, n * k * e + n * pb, n * k * e + n * pb, &s.quantize);
    if (!twoHop) {
      s.move += oneHopExchange(c, pb, plan.hop[0].exchange);
      addKernel(c.kernel.reduce, 1, n * k, n * pb + k * e, &s.finish);
    } else {
      s.move += intraExchange(c, L, N * pb, plan.hop[0].exchange);
      addKernel(c.kernel.reduce, 1, static_cast<double>(L) * N * k, (L + 1.0) * N * pb, &s.move);
      s.finish += interExchange(c, N, L, pb, plan.hop[1].exchange);
      addKernel(c.kernel.reduce, 1, N * k, N * pb + k * e, &s.finish);
    }
  }
  return s;
}

}  // namespace

CollPlan planOf(const ClusterSpec& c, CollKind kind, double count, int elemBytes, int bits, int blockSize,
                int hpzSize) {
  Topology t;
  if (!topologyOf(c, hpzSize, &t)) return CollPlan();
  PlanFacts f;
  f.topo = &t;
  f.tunables.chunkBytes = static_cast<int64_t>(c.pipeline.chunkBytes);
  f.tunables.maxChunks = c.pipeline.maxChunks;
  f.tunables.pairAllGather = c.pipeline.pairAllGather;
  f.tunables.directMinBytes = -1;
  f.tunables.ownSlotEarlyBytes = -1;
  f.link.greenContext = c.pipeline.greenContext();
  f.kind = kind;
  f.count = static_cast<size_t>(std::ceil(count));
  f.elemBytes = static_cast<size_t>(elemBytes);
  f.bits = bits;
  f.blockSize = blockSize;
  return planCollective(f);
}

Traffic ringAllGatherCost(const ClusterSpec& c, double totalBytes) {
  return ringCost(c, totalBytes, &LinkParams::allGather);
}

Traffic ringReduceScatterCost(const ClusterSpec& c, double totalBytes) {
  return ringCost(c, totalBytes, &LinkParams::reduceScatter);
}

Traffic allToAllCost(const ClusterSpec& c, double p) {
  Traffic t;
  const int n = c.nranks(), N = c.nodes();
  if (n <= 1 || p <= 0) return t;
  const LinkCost in = c.intra.allToAll.forSize(n * p, p), out = c.inter.allToAll.forSize(n * p, p);
  double intraMaxUs = 0, egressMax = 0;
  for (int L : c.gpusPerNode) {
    const double intra = p * (L - 1), inter = p * (n - L);
    t.intraBytes += L * intra / n;
    t.interBytes += L * inter / n;
    egressMax = std::max(egressMax, L * inter);
    intraMaxUs = std::max(intraMaxUs, transferUs(intra, in.bwGBs));
  }
  t.nodeEgressBytes = egressMax;
  t.linkUs = std::max(intraMaxUs, transferUs(egressMax, out.bwGBs));
  t.latencyUs = (n - 1) * (N > 1 ? out.latencyUs : in.latencyUs);
  return t;
}

Traffic qwzAllGatherCost(const ClusterSpec& c, double count, int elemBytes, int bits, int blockSize) {
  const CollPlan plan = planOf(c, CollKind::kQuantAllGather, count, elemBytes, bits, blockSize);
  const double overlap = plan.greenStages ? c.pipeline.qwzGreenOverlap : c.pipeline.qwzOverlap;
  return qwzStages(c, plan, elemBytes, bits, blockSize).total(overlap);
}

Traffic hpzAllGatherCost(const ClusterSpec& c, double fullCount, int elemBytes, int hpzSize, std::string* note) {
  const double S = fullCount * elemBytes;
  const LayoutFacts f = layoutFacts(c, hpzSize);
  if (!f.hpzUsable) {
    if (note) *note = "uneven nodes: hpZ unavailable, flat ring all-gather (ZeRO-3's)";
    return ringAllGatherCost(c, S);
  }
  Traffic t;
  const int h = f.hpzSize;
  if (h <= 1) {
    if (note)
      *note =
          "hpZ group of 1 rank: its secondary shard is the whole tensor, nothing crosses a link; NCCL's one-rank "
          "all-gather copies it (out of place)";
    if (S > 0) addKernel(c.kernel.copy, 1, 2 * S, 2 * S, &t);
    return t;
  }
  const LinkCost link = c.intra.allGather.forSize(S, S / h);
  t.intraBytes = (h - 1.0) / h * S;
  t.linkUs = transferUs(t.intraBytes, link.bwGBs);
  t.latencyUs = (h - 1) * link.latencyUs;
  return t;
}

Traffic qgzReduceScatterCost(const ClusterSpec& c, double k, int elemBytes, int bits, int blockSize,
                             std::string* note) {
  const CollPlan plan = planOf(c, CollKind::kQuantReduceScatter, k, elemBytes, bits, blockSize);
  if (plan.path != PlanPath::kTwoHops && note) {
    if (plan.path == PlanPath::kFlat)
      *note = "uneven nodes: qgZ falls back to one flat all-to-all";
    else if (c.nodes() <= 1)
      *note = "one node: qgZ runs one hop (intra-node all-to-all)";
    else
      *note = "one GPU per node: qgZ runs one hop (inter-node all-to-all)";
  }
  return qgzStages(c, plan, elemBytes, bits, blockSize).total(c.pipeline.qgzOverlap);
}

double stepTimeUs(double computeUs, double commUs, double overlap) {
  return computeUs + commUs - overlap * std::min(computeUs, commUs);
}

PaperVolume paperCrossNodeVolume(const ZeroppOptions& z, bool zeropp) {
  PaperVolume v{1, 1, 1};
  if (!zeropp) return v;
  const double w = z.weightBits / 16.0;  // bf16 baseline
  v.forward = z.qwz ? w : 1;
  v.backward = z.hpz ? 0 : (z.qwz && z.qwzBackward ? w : 1);
  v.gradient = z.qgz ? z.gradBits / 16.0 : 1;
  return v;
}

std::string validate(const ClusterSpec& c, const StepConfig& s, const ZeroppOptions& z) {
  if (c.gpusPerNode.empty()) return "the layout has no node";
  for (int g : c.gpusPerNode)
    if (g < 1) return "every node needs at least one GPU";
  if (!(s.params > 0)) return "the model needs a positive parameter count";
  if (s.elemBytes != 2 && s.elemBytes != 4) return "element bytes must be 2 (bf16/fp16) or 4 (fp32)";
  if (s.bucketParams < 0) return "bucket size must be >= 0";
  if (s.computeMs < 0) return "compute time must be >= 0";
  if (!(s.overlap >= 0 && s.overlap <= 1)) return "overlap must be in [0, 1]";
  if (!isValidBits(z.weightBits) || !isValidBits(z.gradBits)) return std::string("bits must be ") + kBitsRule;
  if (!isValidBlockSize(z.blockSize)) return std::string("block size must be ") + kBlockSizeRule;
  if (z.hpzSize < 0) return "hpZ size must be >= 0";
  for (int g : c.gpusPerNode)
    if (z.hpzSize > 0 && g % z.hpzSize != 0)
      return "hpZ size " + std::to_string(z.hpzSize) + " does not divide the " + std::to_string(g) + " GPUs of a node";
  for (const LinkParams* p : {&c.intra, &c.inter})
    for (const LinkCost* l : {&p->allGather, &p->reduceScatter, &p->allToAll})
      if (!(l->bwGBs > 0) || !(l->latencyUs >= 0)) return "link bandwidths must be > 0 and latencies >= 0";
  for (const KernelCost* k :
       {&c.kernel.quantizeInt8, &c.kernel.quantizeInt4, &c.kernel.dequantize, &c.kernel.reduce, &c.kernel.copy})
    if (!(k->rate > 0) || !(k->launchUs >= 0)) return "kernel rates must be > 0 and launch costs >= 0";
  if (!(c.pipeline.chunkBytes > 0) || c.pipeline.maxChunks < 1) return "pipeline chunks must be > 0 bytes, >= 1";
  if (c.pipeline.ncclSms < 0) return "SMs left to NCCL must be >= 0";
  if (c.pipeline.pairAllGather < 0 || c.pipeline.pairAllGather > 2) return "the pair all-gather mode must be 0, 1 or 2";
  for (double w : {c.pipeline.qwzOverlap, c.pipeline.qwzGreenOverlap, c.pipeline.qgzOverlap})
    if (!(w >= 0 && w <= 1)) return "pipeline overlaps must be in [0, 1]";
  return "";
}

namespace {

const char* dtypeName(int elemBytes) { return elemBytes == 4 ? "fp32" : "bf16"; }
std::string intName(int bits) { return "int" + std::to_string(bits); }

void addNote(std::vector<std::string>* notes, const std::string& what, const std::string& note) {
  if (notes == nullptr || note.empty()) return;
  const std::string line = what + ": " + note;
  if (std::find(notes->begin(), notes->end(), line) == notes->end()) notes->push_back(line);
}

}  // namespace

StepCost stepCost(const ClusterSpec& c, const StepConfig& s, const ZeroppOptions& z, bool zeropp,
                  std::vector<std::string>* notes) {
  StepCost r;
  const int n = c.nranks();
  const double calls = s.bucketParams > 0 ? std::ceil(s.params / s.bucketParams) : 1.0;
  const double shard = std::ceil(s.params / calls / n);  // elements per rank per call (ZeRO pads to n)
  const double full = shard * n;
  const int e = s.elemBytes;
  auto finish = [&](CollectiveCost* cc, const Traffic& one) {
    cc->calls = static_cast<int>(calls);
    cc->traffic = one.scaled(calls);
  };
  const std::string ring = std::string("ring all-gather ") + dtypeName(e);

  // Forward weight gather.
  if (zeropp && z.qwz) {
    r.forward.scheme = "qwZ all-gather " + intName(z.weightBits);
    finish(&r.forward, qwzAllGatherCost(c, shard, e, z.weightBits, z.blockSize));
  } else {
    r.forward.scheme = ring;
    finish(&r.forward, ringAllGatherCost(c, full * e));
  }
  // Backward weight gather.
  const bool quantBackward = zeropp && z.qwz && z.qwzBackward;
  if (zeropp && z.hpz && c.isEven()) {
    const LayoutFacts f = layoutFacts(c, z.hpzSize);
    r.backward.scheme = "hpZ all-gather " + std::string(dtypeName(e)) + ", groups of " + std::to_string(f.hpzSize);
    finish(&r.backward, hpzAllGatherCost(c, full, e, z.hpzSize, &r.backward.note));
  } else {
    if (zeropp && z.hpz) r.backward.note = "uneven nodes: hpZ unavailable, flat all-gather instead";
    if (quantBackward) {
      r.backward.scheme = "qwZ all-gather " + intName(z.weightBits);
      finish(&r.backward, qwzAllGatherCost(c, shard, e, z.weightBits, z.blockSize));
    } else {
      r.backward.scheme = ring;
      finish(&r.backward, ringAllGatherCost(c, full * e));
    }
  }
  // Gradient reduce-scatter.
  if (zeropp && z.qgz) {
    const bool twoHop =
        planOf(c, CollKind::kQuantReduceScatter, shard, e, z.gradBits, z.blockSize).path == PlanPath::kTwoHops;
    r.gradient.scheme = "qgZ " + intName(z.gradBits) + (twoHop ? ", two hops" : ", one hop");
    finish(&r.gradient, qgzReduceScatterCost(c, shard, e, z.gradBits, z.blockSize, &r.gradient.note));
  } else {
    r.gradient.scheme = std::string("ring reduce-scatter ") + dtypeName(e);
    finish(&r.gradient, ringReduceScatterCost(c, full * e));
  }
  addNote(notes, "backward gather", r.backward.note);
  addNote(notes, "gradient reduce-scatter", r.gradient.note);

  r.comm = r.forward.traffic;
  r.comm += r.backward.traffic;
  r.comm += r.gradient.traffic;
  r.computeUs = s.computeMs * 1e3;
  r.stepUs = stepTimeUs(r.computeUs, r.comm.timeUs(), s.overlap);
  r.crossNodeM = r.comm.nodeEgressBytes / (s.params * e);
  return r;
}

Comparison compareStep(const ClusterSpec& c, const StepConfig& s, const ZeroppOptions& z, std::string* error) {
  Comparison out;
  const std::string problem = validate(c, s, z);
  if (error) *error = problem;
  if (!problem.empty()) return out;
  out.modelBytes = s.params * s.elemBytes;
  out.zero3 = stepCost(c, s, z, false, nullptr);
  out.zeropp = stepCost(c, s, z, true, &out.notes);
  out.speedup = out.zeropp.stepUs > 0 ? out.zero3.stepUs / out.zeropp.stepUs : 0;
  out.paperZero3 = paperCrossNodeVolume(z, false);
  out.paperZeropp = paperCrossNodeVolume(z, true);
  // Say so when a ZeRO++ collective loses to ZeRO-3's on this layout (e.g. a flat one-hop all-to-all sends L
  // times more across nodes than a ring).
  const char* names[] = {"forward gather", "backward gather", "gradient reduce-scatter"};
  const CollectiveCost* z3[] = {&out.zero3.forward, &out.zero3.backward, &out.zero3.gradient};
  const CollectiveCost* zpp[] = {&out.zeropp.forward, &out.zeropp.backward, &out.zeropp.gradient};
  for (int k = 0; k < 3; ++k) {
    const double a = zpp[k]->traffic.timeUs(), b = z3[k]->traffic.timeUs();
    if (a > b * 1.0001) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), " (%.3g ms against %.3g ms)", a / 1e3, b / 1e3);
      addNote(&out.notes, names[k], zpp[k]->scheme + " is slower than ZeRO-3's " + z3[k]->scheme + buf);
    }
  }
  if (z.hpz && c.isEven()) out.hpzSecondaryBytes = out.modelBytes / layoutFacts(c, z.hpzSize).hpzSize;
  return out;
}

// ---- calibration -------------------------------------------------------------------------------------------

RowKind classifyOp(const std::string& opIn) {
  std::string op = opIn;
  for (char& ch : op) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  auto has = [&](const char* w) { return op.find(w) != std::string::npos; };
  const bool gather = has("all_gather") || has("allgather");
  const bool scatter = has("reduce_scatter") || has("reducescatter");
  if (has("qwz") && has("hpz")) return RowKind::kQwzHpz;
  if (has("qwz") || (gather && has("quant"))) return RowKind::kQwz;
  if (has("hpz") || (gather && has("hier"))) return RowKind::kHpz;
  if (has("qgz") || (scatter && has("quant"))) return RowKind::kQgz;
  if (has("nccl") || op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") {
    if (gather) return RowKind::kNcclAllGather;
    if (scatter) return RowKind::kNcclReduceScatter;
    if (has("all_to_all") || has("alltoall")) return RowKind::kNcclAllToAll;
  }
  if (has("dequantize")) return RowKind::kDequantize;
  if (has("quantize")) return RowKind::kQuantize;
  return RowKind::kUnknown;
}

namespace {
// A setting from a row's env; 0 when the row does not say (a row without it comes from a build without the
// setting, which behaved as 0 does).
int envSetting(const PerfRow& row, const char* name) {
  const auto it = row.env.find(name);
  return it == row.env.end() ? 0 : static_cast<int>(std::strtol(it->second.c_str(), nullptr, 10));
}
}  // namespace

int rowNcclSms(const PerfRow& row) { return envSetting(row, "ZP_NCCL_SMS"); }
int rowPairAllGather(const PerfRow& row) { return envSetting(row, "ZP_PAIR_ALLGATHER"); }

bool isGreenContextRow(const PerfRow& row) {
  const RowKind kind = classifyOp(row.op);
  const bool quantizedGather =
      kind == RowKind::kQwz || kind == RowKind::kQwzHpz || (kind == RowKind::kHpz && row.bits > 0);
  return quantizedGather && rowNcclSms(row) != 0;
}

const char* rowKindName(RowKind k) {
  switch (k) {
    case RowKind::kNcclAllGather:
      return "nccl all-gather";
    case RowKind::kNcclReduceScatter:
      return "nccl reduce-scatter";
    case RowKind::kNcclAllToAll:
      return "nccl all-to-all";
    case RowKind::kQwz:
      return "qwZ";
    case RowKind::kHpz:
      return "hpZ";
    case RowKind::kQwzHpz:
      return "qwZ + hpZ";
    case RowKind::kQgz:
      return "qgZ";
    case RowKind::kQuantize:
      return "quantize";
    case RowKind::kDequantize:
      return "dequantize";
    default:
      return "unknown";
  }
}

LinkFit fitLatencyBandwidth(const std::vector<FitPoint>& points) {
  LinkFit f;
  // Weighted normal equations of t = a*s + b*x (a: latency per step, b: us per MB), weights 1/scale^2.
  double ss = 0, sx = 0, xx = 0, st = 0, xt = 0, xMin = 1e300, xMax = -1e300;
  int used = 0;
  for (const FitPoint& p : points) {
    const double scale = p.scaleUs > 0 ? p.scaleUs : p.timeUs;
    if (!(scale > 0) || !(p.bytes > 0) || !std::isfinite(p.timeUs)) continue;
    const double w = 1.0 / (scale * scale), x = p.bytes * 1e-6;
    ss += w * p.steps * p.steps;
    sx += w * p.steps * x;
    xx += w * x * x;
    st += w * p.steps * p.timeUs;
    xt += w * x * p.timeUs;
    xMin = std::min(xMin, x);
    xMax = std::max(xMax, x);
    ++used;
  }
  if (used == 0) return f;
  double a = 0, b = 0;
  const double det = ss * xx - sx * sx;
  if (xMax > xMin * (1 + 1e-9) && det > 1e-12 * ss * xx) {
    a = (st * xx - sx * xt) / det;
    b = (ss * xt - sx * st) / det;
  }
  if (!(a > 0) || !(b > 0)) {  // one size, or a negative latency: bandwidth alone
    a = 0;
    b = xt / xx;
  }
  if (!(b > 0) || !std::isfinite(b)) return f;
  f.ok = true;
  f.points = used;
  f.cost.latencyUs = a;
  f.cost.bwGBs = 1e3 / b;  // b us per MB: 1e6 / b bytes per us, 1e3 / b GB/s
  double sum = 0;
  for (const FitPoint& p : points) {
    const double scale = p.scaleUs > 0 ? p.scaleUs : p.timeUs;
    if (!(scale > 0) || !(p.bytes > 0)) continue;
    const double err = (a * p.steps + b * p.bytes * 1e-6 - p.timeUs) / scale;
    sum += err * err;
  }
  f.rmsErrPct = 100 * std::sqrt(sum / used);
  return f;
}

namespace {

// The items of size >= kFitMinBytes when they hold two distinct sizes or more, else all of them.
template <typename T, typename SizeOf>
std::vector<T> largeOnes(const std::vector<T>& all, SizeOf sizeOf) {
  std::vector<T> large;
  std::vector<double> sizes;
  for (const T& item : all)
    if (sizeOf(item) >= kFitMinBytes) {
      large.push_back(item);
      if (std::find(sizes.begin(), sizes.end(), sizeOf(item)) == sizes.end()) sizes.push_back(sizeOf(item));
    }
  return sizes.size() >= 2 ? large : all;
}

}  // namespace

LinkFit fitLargeRows(const std::vector<FitPoint>& points) {
  return fitLatencyBandwidth(largeOnes(points, [](const FitPoint& p) { return p.size; }));
}

LinkFit fitLinkRows(const std::vector<FitPoint>& points, LinkFit* small) {
  LinkFit large = fitLargeRows(points);
  if (small) *small = LinkFit();
  std::vector<double> largeSizes, smallSizes;
  std::vector<FitPoint> smaller;
  for (const FitPoint& p : points) {
    std::vector<double>& sizes = p.size >= kFitMinBytes ? largeSizes : smallSizes;
    if (std::find(sizes.begin(), sizes.end(), p.size) == sizes.end()) sizes.push_back(p.size);
    if (p.size > 0 && p.size < kFitMinBytes) smaller.push_back(p);
  }
  smallSizes.erase(std::remove(smallSizes.begin(), smallSizes.end(), 0.0), smallSizes.end());  // size unknown
  // Fewer than two large sizes: largeOnes fitted every point, one line for all sizes.
  if (!large.ok || largeSizes.size() < 2 || smallSizes.size() < 2) return large;
  const double below = *std::min_element(largeSizes.begin(), largeSizes.end());
  const LinkFit s = fitLatencyBandwidth(smaller);
  if (!s.ok) return large;
  if (small) *small = s;
  large.cost.smallBelowBytes = below;
  large.cost.smallBwGBs = s.cost.bwGBs;
  large.cost.smallLatencyUs = s.cost.latencyUs;
  return large;
}

namespace {

int elemBytesOfType(const std::string& type) {
  if (type == "float" || type == "float32" || type == "fp32" || type == "int32" || type == "uint32") return 4;
  if (type == "double" || type == "float64" || type == "int64" || type == "uint64") return 8;
  if (type == "int8" || type == "uint8" || type == "f8e4m3" || type == "f8e5m2") return 1;
  return 2;  // bfloat16, half, or not said: the perf binaries' default
}

// The layout a row ran on: ranks spread over its nodes, the first nodes taking any remainder; its configuration
// (ZP_NCCL_SMS, ZP_PAIR_ALLGATHER) from its env.
bool rowCluster(const PerfRow& row, const LinkParams& link, const KernelParams& kernel, const PipelineParams& pipeline,
                ClusterSpec* c) {
  if (row.ranks < 1) return false;
  const int nodes = std::min(std::max(row.nodes, 1), row.ranks);
  c->gpusPerNode.assign(nodes, row.ranks / nodes);
  for (int i = 0; i < row.ranks % nodes; ++i) c->gpusPerNode[i]++;
  c->intra = c->inter = link;
  c->kernel = kernel;
  c->pipeline = pipeline;
  c->pipeline.ncclSms = rowNcclSms(row);
  c->pipeline.pairAllGather = rowPairAllGather(row);
  return true;
}

bool isLocal(RowKind k) { return k == RowKind::kQuantize || k == RowKind::kDequantize; }

// A row's settings as the perf binaries ran it.
struct RowShape {
  RowKind kind = RowKind::kUnknown;
  int n = 0, e = 2, bits = 8, block = 256;
  double perRank = 0;  // elements per rank: qwZ's shard, qgZ's recvcount
};

bool rowShape(const PerfRow& row, RowShape* s) {
  s->kind = classifyOp(row.op);
  s->n = std::max(row.ranks, 1);
  s->e = elemBytesOfType(row.type);
  s->block = row.block > 0 ? row.block : 256;
  s->bits = row.bits > 0 ? row.bits : (s->kind == RowKind::kQgz ? 4 : 8);
  s->perRank = std::floor(row.size / s->e / s->n);  // the perf binaries round down to whole elements per rank
  return row.size > 0 && isValidBits(s->bits) && isValidBlockSize(s->block);
}

// The pipeline stages of a qwZ or qgZ row.
bool rowStages(const PerfRow& row, const LinkParams& link, const KernelParams& kernel, const PipelineParams& pipeline,
               Stages* st) {
  ClusterSpec c;
  RowShape s;
  if (!rowShape(row, &s) || !rowCluster(row, link, kernel, pipeline, &c)) return false;
  if (s.kind == RowKind::kQwz) {
    *st = qwzStages(c, planOf(c, CollKind::kQuantAllGather, s.perRank, s.e, s.bits, s.block), s.e, s.bits, s.block);
    return true;
  }
  if (s.kind == RowKind::kQgz) {
    *st = qgzStages(c, planOf(c, CollKind::kQuantReduceScatter, s.perRank, s.e, s.bits, s.block), s.e, s.bits, s.block);
    return true;
  }
  return false;
}

// The model's cost of a row's call (or of its baseline's).
bool rowTraffic(const PerfRow& row, bool baseline, const LinkParams& link, const KernelParams& kernel,
                const PipelineParams& pipeline, Traffic* t) {
  ClusterSpec c;
  RowShape s;
  if (!rowShape(row, &s) || !rowCluster(row, link, kernel, pipeline, &c)) return false;
  const double S = row.size;
  *t = Traffic();
  if (baseline) {
    switch (s.kind) {
      case RowKind::kQwz:
      case RowKind::kHpz:  // ZeRO-3's global gather of the full tensor
      case RowKind::kNcclAllGather:
        *t = ringAllGatherCost(c, S);
        return true;
      case RowKind::kQwzHpz:  // ZeRO-3's forward and backward gathers
        *t = ringAllGatherCost(c, S);
        *t += ringAllGatherCost(c, S);
        return true;
      case RowKind::kQgz:
      case RowKind::kNcclReduceScatter:
        *t = ringReduceScatterCost(c, S);
        return true;
      case RowKind::kNcclAllToAll:
        *t = allToAllCost(c, S / s.n);
        return true;
      default:
        return false;
    }
  }
  switch (s.kind) {
    case RowKind::kNcclAllGather:
      *t = ringAllGatherCost(c, S);
      return true;
    case RowKind::kNcclReduceScatter:
      *t = ringReduceScatterCost(c, S);
      return true;
    case RowKind::kNcclAllToAll:
      *t = allToAllCost(c, S / s.n);
      return true;
    case RowKind::kQwz:
      *t = qwzAllGatherCost(c, s.perRank, s.e, s.bits, s.block);
      return true;
    case RowKind::kHpz:
      *t = hpzAllGatherCost(c, s.perRank * s.n, s.e, 0, nullptr);
      return true;
    case RowKind::kQwzHpz:
      *t = qwzAllGatherCost(c, s.perRank, s.e, s.bits, s.block);
      *t += hpzAllGatherCost(c, s.perRank * s.n, s.e, 0, nullptr);
      return true;
    case RowKind::kQgz:
      *t = qgzReduceScatterCost(c, s.perRank, s.e, s.bits, s.block, nullptr);
      return true;
    case RowKind::kQuantize:
    case RowKind::kDequantize: {
      const double bytes = S + payloadBytes(S / s.e, s.bits, s.block);
      addKernel(s.kind == RowKind::kQuantize ? kernel.quantizeCost(s.bits) : kernel.dequantize, 1, bytes, bytes, t);
      return true;
    }
    default:
      return false;
  }
}

std::string regimeOf(const PerfRow& row) { return row.regime.empty() ? std::string("-") : row.regime; }

ParamFit paramFitOf(const LinkFit& f) {
  ParamFit p;
  p.ok = f.ok;
  p.points = f.points;
  p.rmsErrPct = f.rmsErrPct;
  return p;
}

// A pipelined row for the overlap fits: measured time, the stages' sum and what an ideal pipeline hides.
struct PipelinePoint {
  double size = 0, timeUs = 0, sumUs = 0, idealHiddenUs = 0;
};

// The least-squares overlap (relative errors) of time = sum - w * idealHidden, clamped to [0, 1]; false when no
// point has anything to hide (every row one chunk). *sq: the sum of squared relative errors at that w.
bool fitOverlap(const std::vector<PipelinePoint>& points, double* w, double* sq) {
  double num = 0, den = 0;
  for (const PipelinePoint& p : points) {
    const double inv = 1.0 / (p.timeUs * p.timeUs);
    num += (p.sumUs - p.timeUs) * p.idealHiddenUs * inv;
    den += p.idealHiddenUs * p.idealHiddenUs * inv;
  }
  if (!(den > 0)) return false;
  *w = std::min(1.0, std::max(0.0, num / den));
  *sq = 0;
  for (const PipelinePoint& p : points) {
    const double err = (p.sumUs - *w * p.idealHiddenUs - p.timeUs) / p.timeUs;
    *sq += err * err;
  }
  return true;
}

// The pipelined rows of one kind and configuration (green: isGreenContextRow) with their stages under these
// parameters (from kFitMinBytes, see largeOnes).
std::vector<PipelinePoint> pipelinePoints(const std::vector<PerfRow>& rows, RowKind kind, bool green,
                                          const std::map<std::string, RegimeFit>& regimes, const KernelParams& kernel,
                                          const PipelineParams& pipeline) {
  std::vector<PipelinePoint> points;
  for (const PerfRow& row : rows) {
    if (classifyOp(row.op) != kind || isGreenContextRow(row) != green || !(row.timeUs > 0)) continue;
    auto it = regimes.find(regimeOf(row));
    Stages st;
    if (it == regimes.end() || !rowStages(row, it->second.link, kernel, pipeline, &st)) continue;
    points.push_back({row.size, row.timeUs, st.sumUs(), st.idealHiddenUs()});
  }
  return largeOnes(points, [](const PipelinePoint& p) { return p.size; });
}

std::string fmt(const char* format, double a, double b = 0) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), format, a, b);
  return buf;
}

}  // namespace

std::string rowConfiguration(const PerfRow& row) {
  if (isGreenContextRow(row)) return "green context";
  if (usesPairGather(row)) return "pair all-gather";
  return std::string();
}

bool usesPairGather(const PerfRow& row) {
  ClusterSpec c;
  RowShape s;
  return classifyOp(row.op) == RowKind::kQgz && rowShape(row, &s) &&
         rowCluster(row, LinkParams(), KernelParams(), PipelineParams(), &c) &&
         qgzPairGathers(c, s.perRank, s.e, s.bits, s.block);
}

double predictRowUs(const PerfRow& row, bool baseline, const LinkParams& link, const KernelParams& kernel,
                    const PipelineParams& pipeline) {
  Traffic t;
  return rowTraffic(row, baseline, link, kernel, pipeline, &t) ? t.timeUs() : -1;
}

Calibration calibrate(const std::vector<PerfRow>& rows, const KernelParams& defaults,
                      const PipelineParams& pipelineDefaults) {
  Calibration cal;
  cal.kernel = defaults;
  cal.pipeline = pipelineDefaults;
  cal.greenRows = static_cast<int>(std::count_if(rows.begin(), rows.end(), isGreenContextRow));
  // Step 1: each regime's links from NCCL's own times: t = (n-1) * alpha + size * (n-1)/n / bw per call.
  struct Points {
    std::vector<FitPoint> ag, rs, a2a;
  };
  std::map<std::string, Points> points;
  int unknown = 0, oneRank = 0;
  for (const PerfRow& row : rows) {
    const RowKind kind = classifyOp(row.op);
    if (kind == RowKind::kUnknown) {
      ++unknown;
      continue;
    }
    if (row.ranks < 2 || !(row.size > 0)) {
      oneRank += !isLocal(kind);
      continue;
    }
    const double steps = row.ranks - 1, bytes = row.size * (row.ranks - 1.0) / row.ranks;
    Points& p = points[regimeOf(row)];
    if (row.timeUs > 0) {
      if (kind == RowKind::kNcclAllGather) p.ag.push_back({steps, bytes, row.timeUs, 0, row.size});
      if (kind == RowKind::kNcclReduceScatter) p.rs.push_back({steps, bytes, row.timeUs, 0, row.size});
      if (kind == RowKind::kNcclAllToAll) p.a2a.push_back({steps, bytes, row.timeUs, 0, row.size});
    }
    if (row.ncclTimeUs > 0) {
      if (kind == RowKind::kQwz || kind == RowKind::kHpz) p.ag.push_back({steps, bytes, row.ncclTimeUs, 0, row.size});
      if (kind == RowKind::kQwzHpz) p.ag.push_back({2 * steps, 2 * bytes, row.ncclTimeUs, 0, row.size});
      if (kind == RowKind::kQgz) p.rs.push_back({steps, bytes, row.ncclTimeUs, 0, row.size});
    }
  }
  if (unknown) cal.notes.push_back(std::to_string(unknown) + " row(s) of unknown ops skipped");
  if (oneRank) cal.notes.push_back(std::to_string(oneRank) + " collective row(s) without ranks >= 2 or a size skipped");
  for (auto& entry : points) {
    RegimeFit f;
    f.allGather = fitLinkRows(entry.second.ag, &f.smallAllGather);
    f.reduceScatter = fitLinkRows(entry.second.rs, &f.smallReduceScatter);
    f.allToAll = fitLinkRows(entry.second.a2a, &f.smallAllToAll);
    const LinkFit* base = f.allGather.ok ? &f.allGather : f.reduceScatter.ok ? &f.reduceScatter : &f.allToAll;
    if (!base->ok) {
      cal.notes.push_back("regime " + entry.first + ": no NCCL rows to fit, its rows are not predicted");
      continue;
    }
    f.ok = true;
    f.link.allGather = f.allGather.ok ? f.allGather.cost : base->cost;
    f.link.reduceScatter = f.reduceScatter.ok ? f.reduceScatter.cost : base->cost;
    f.link.allToAll = f.allToAll.ok ? f.allToAll.cost : base->cost;
    const char* kinds[] = {"all-gather", "reduce-scatter", "all-to-all"};
    const LinkFit* fits[] = {&f.allGather, &f.reduceScatter, &f.allToAll};
    for (int k = 0; k < 3; ++k)
      if (!fits[k]->ok)
        cal.notes.push_back("regime " + entry.first + ": no NCCL " + kinds[k] + " rows, " + kinds[k] +
                            " borrows the fit of another collective");
    cal.regimes[entry.first] = f;
  }

  // Step 2: quantize (per code width) and dequantize from their own rows (t = launch + bytes read and written /
  // rate), the copy from the hpZ rows of one-rank groups (t = launch + 2 * size / rate).
  std::vector<FitPoint> quantize8, quantize4, dequantize, copy;
  for (const PerfRow& row : rows) {
    const RowKind kind = classifyOp(row.op);
    RowShape s;
    if (!(row.timeUs > 0) || !rowShape(row, &s)) continue;
    if (isLocal(kind)) {
      const double bytes = row.size + payloadBytes(row.size / s.e, s.bits, s.block);
      std::vector<FitPoint>& to = kind == RowKind::kDequantize ? dequantize : s.bits == 4 ? quantize4 : quantize8;
      to.push_back({1, bytes, row.timeUs, 0, row.size});
    } else if (kind == RowKind::kHpz) {
      ClusterSpec c;
      if (!rowCluster(row, LinkParams(), defaults, pipelineDefaults, &c)) continue;
      const LayoutFacts f = layoutFacts(c, 0);
      if (f.hpzUsable && f.hpzSize == 1) copy.push_back({1, 2 * row.size, row.timeUs, 0, row.size});
    }
  }
  struct KernelStep {
    const char* name;
    const std::vector<FitPoint>* points;
    KernelCost* cost;
    ParamFit* fit;
  };
  for (const KernelStep& k : {KernelStep{"int8 quantize", &quantize8, &cal.kernel.quantizeInt8, &cal.quantizeInt8Fit},
                              KernelStep{"int4 quantize", &quantize4, &cal.kernel.quantizeInt4, &cal.quantizeInt4Fit},
                              KernelStep{"dequantize", &dequantize, &cal.kernel.dequantize, &cal.dequantizeFit},
                              KernelStep{"copy", &copy, &cal.kernel.copy, &cal.copyFit}}) {
    const LinkFit f = fitLargeRows(*k.points);
    *k.fit = paramFitOf(f);
    if (f.ok) {
      *k.cost = KernelCost{f.cost.bwGBs, f.cost.latencyUs};
      cal.kernelFitted = true;
    } else {
      cal.notes.push_back(std::string("no ") + k.name + " rows" +
                          (k.cost == &cal.kernel.copy ? " (hpZ over one-rank groups)" : "") +
                          ": its kernel keeps the given parameters");
    }
  }

  // Step 3: qwZ's pipeline overlap in each configuration, given the links and the (shared) kernels.
  for (const bool green : {false, true}) {
    const std::vector<PipelinePoint> p =
        pipelinePoints(rows, RowKind::kQwz, green, cal.regimes, cal.kernel, cal.pipeline);
    double& overlap = green ? cal.pipeline.qwzGreenOverlap : cal.pipeline.qwzOverlap;
    double w = 0, sq = 0;
    if (fitOverlap(p, &w, &sq)) {
      overlap = w;
      (green ? cal.qwzGreenOverlapFit : cal.qwzOverlapFit) =
          ParamFit{true, static_cast<int>(p.size()), 100 * std::sqrt(sq / p.size())};
      cal.kernelFitted = true;
    } else {
      cal.notes.push_back(fmt(green ? "no pipelined qwZ rows (several chunks) run in a green context (ZP_NCCL_SMS"
                                      " non-zero): that overlap keeps the given value, %.2f"
                                    : "no pipelined qwZ rows (several chunks) run with every SM (ZP_NCCL_SMS=0):"
                                      " that overlap keeps the given value, %.2f",
                              overlap));
    }
  }
  if (cal.greenRows > 0)
    cal.notes.push_back(std::to_string(cal.greenRows) +
                        " row(s) of quantized gathers run in a green context (ZP_NCCL_SMS non-zero), modelled with" +
                        fmt(" their own overlap: qwZ %.3f in a green context, %.3f with every SM",
                            cal.pipeline.qwzGreenOverlap, cal.pipeline.qwzOverlap));

  // Step 4: the reduce kernel's rate and qgZ's overlap together: for each rate, the best overlap in closed form;
  // the rate minimising the squared relative errors, by a scan over 1e-2 .. 1e5 G element-sources/s (48 per
  // decade) and a golden-section search around the best point.
  {
    KernelParams k = cal.kernel;
    k.reduce.launchUs = cal.kernel.dequantize.launchUs;
    auto evaluate = [&](double logRate, double* w, int* used) {
      k.reduce.rate = std::pow(10.0, logRate);
      const std::vector<PipelinePoint> p = pipelinePoints(rows, RowKind::kQgz, false, cal.regimes, k, cal.pipeline);
      double sq = 0;
      *used = static_cast<int>(p.size());
      *w = cal.pipeline.qgzOverlap;
      if (!fitOverlap(p, w, &sq)) {  // nothing pipelined: the rate alone, at the given overlap
        sq = 0;
        for (const PipelinePoint& q : p) {
          const double err = (q.sumUs - *w * q.idealHiddenUs - q.timeUs) / q.timeUs;
          sq += err * err;
        }
      }
      return sq;
    };
    double w = 0;
    int used = 0;
    evaluate(0, &w, &used);
    if (used == 0) {
      cal.notes.push_back("no qgZ rows: the reduce kernel and qgZ's overlap keep the given parameters");
    } else {
      double best = -2, bestErr = 1e300;
      for (double x = -2; x <= 5 + 1e-9; x += 1.0 / 48) {
        const double err = evaluate(x, &w, &used);
        if (err < bestErr) bestErr = err, best = x;
      }
      double lo = best - 1.0 / 48, hi = best + 1.0 / 48;
      const double g = (std::sqrt(5.0) - 1) / 2;
      for (int i = 0; i < 60; ++i) {
        const double a = hi - g * (hi - lo), b = lo + g * (hi - lo);
        if (evaluate(a, &w, &used) < evaluate(b, &w, &used))
          hi = b;
        else
          lo = a;
      }
      const double err = evaluate((lo + hi) / 2, &w, &used);
      cal.kernel.reduce = k.reduce;
      cal.reduceFit = cal.qgzOverlapFit = ParamFit{true, used, 100 * std::sqrt(err / used)};
      std::vector<PipelinePoint> p = pipelinePoints(rows, RowKind::kQgz, false, cal.regimes, k, cal.pipeline);
      double sq = 0;
      if (fitOverlap(p, &w, &sq)) {
        cal.pipeline.qgzOverlap = w;
      } else {
        cal.qgzOverlapFit = ParamFit();
        cal.notes.push_back("no pipelined qgZ rows (several chunks): qgZ's overlap keeps the given value");
      }
      cal.kernelFitted = true;
      if (k.reduce.rate < 1.0001e-2 || k.reduce.rate > 0.9999e5)
        cal.notes.push_back(fmt("the reduce rate ran into the search's bound (%g G element-sources/s)", k.reduce.rate));
    }
  }

  // Step 5: every row, predicted against measured.
  for (size_t i = 0; i < rows.size(); ++i) {
    const PerfRow& row = rows[i];
    const RowKind kind = classifyOp(row.op);
    const bool local = isLocal(kind);
    LinkParams link = LinkParams::uniform(1, 0);
    auto it = cal.regimes.find(regimeOf(row));
    if (!local && it == cal.regimes.end()) continue;
    if (!local) link = it->second.link;
    PerfRow one = row;
    if (local && one.ranks < 1) one.ranks = 1;
    for (int variant = 0; variant < 2; ++variant) {
      const bool baseline = variant == 1;
      const double measured = baseline ? row.ncclTimeUs : row.timeUs;
      if (!(measured > 0)) continue;
      if (baseline &&
          (kind == RowKind::kNcclAllGather || kind == RowKind::kNcclReduceScatter || kind == RowKind::kNcclAllToAll))
        continue;
      const double predicted = predictRowUs(one, baseline, link, cal.kernel, cal.pipeline);
      if (!(predicted > 0)) continue;
      RowCheck c;
      c.what = row.op + (baseline ? " (nccl baseline)" : "");
      c.regime = regimeOf(row);
      c.type = row.type;
      c.size = row.size;
      c.ranks = row.ranks;
      c.nodes = row.nodes;
      c.bits = row.bits;
      c.block = row.block;
      if (!baseline) c.config = rowConfiguration(row);
      c.row = i;
      c.baseline = baseline;
      c.measuredUs = measured;
      c.predictedUs = predicted;
      c.errPct = 100 * (predicted - measured) / measured;
      c.flagged = row.size >= kCheckMinBytes && std::fabs(c.errPct) > kCheckMaxErrPct;
      cal.flagged += c.flagged;
      cal.checks.push_back(c);
    }
  }
  cal.points = averagePoints(cal.checks);
  for (const PointCheck& p : cal.points) cal.pointsFlagged += p.flagged;
  return cal;
}

std::vector<PointCheck> averagePoints(const std::vector<RowCheck>& checks) {
  std::map<CheckedCall, size_t> index;
  std::vector<PointCheck> points;
  for (const RowCheck& c : checks) {
    CheckedCall call = c;
    if (c.baseline) call.bits = call.block = 0;  // a baseline's point serves the rows of either width
    auto it = index.find(call);
    if (it == index.end()) {
      it = index.emplace(call, points.size()).first;
      PointCheck p;
      static_cast<CheckedCall&>(p) = call;
      p.minUs = p.maxUs = c.measuredUs;
      points.push_back(p);
    }
    PointCheck& p = points[it->second];
    ++p.repeats;
    p.measuredUs += c.measuredUs;  // sums until the end
    p.predictedUs += c.predictedUs;
    p.minUs = std::min(p.minUs, c.measuredUs);
    p.maxUs = std::max(p.maxUs, c.measuredUs);
  }
  for (PointCheck& p : points) {
    p.measuredUs /= p.repeats;
    p.predictedUs /= p.repeats;
    p.errPct = 100 * (p.predictedUs - p.measuredUs) / p.measuredUs;
    p.flagged = p.size >= kCheckMinBytes && std::fabs(p.errPct) > kCheckMaxErrPct;
  }
  return points;
}

}  // namespace zp
