// Cost model of one training step's communication: ZeRO-3 (bf16 ring all-gather forward and backward, bf16 ring
// reduce-scatter of gradients) against ZeRO++ (qwZ forward gather, hpZ backward gather, qgZ gradient
// reduce-scatter, each on or off), on a layout of nodes x GPUs. It describes what this implementation does
// (src/cuda/pipeline.h), pricing the library's own plan of each call (host/coll_plan.h: path, chunks, each hop's
// exchange): NCCL links with a bandwidth and a per-step cost, quantize / dequantize / reduce / copy kernels each at
// its own speed, and the three-stage chunk pipeline of qwZ and qgZ with the share of its overlap that the
// implementation achieves. Also the calibration of all of it from the perf binaries' JSON (-J).
// Pure host C++17: the tool tools/model/zpccl_model.cc and tests/test_cost_model.cc use it. Every formula is in
// tools/model/cost_model.cc, section "the formulas".
//
// Units: bytes, microseconds, GB/s (1e9 bytes per second). M = model parameters x element bytes (bf16: 2).
//
// What "cross-node volume" means here: the bytes that leave one node per collective (all of its GPUs' NICs
// together). A ring over n ranks moves (n-1)/n of the tensor out of every node, ~M at large n, whatever the
// number of GPUs per node L; averaged over the node's GPUs that is M/L per GPU. The paper's "M per collective"
// and its 3M -> 0.75M are the same ratio in either unit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "host/coll_plan.h"
#include "tools/model/json_in.h"

namespace zp {

// ---- parameters --------------------------------------------------------------------------------------------

// One kind of collective on one class of link: a bus bandwidth (nccl-tests' busbw: the collective's bytes
// times (n-1)/n over the time) and a cost per step (a ring step, or a peer of an all-to-all). A step of x bytes
// takes latencyUs + x / bw: the same as a bandwidth that grows with the message, bw * x / (x + latencyUs * bw),
// half of it at x = latencyUs * bw. Calibrated from 16 MiB up, latencyUs is that ramp, not the small-message
// latency (zpccl-model --calibrate prints the fitted lines). A ring of n ranks pays it on each of its n-1 steps, a
// pipelined call once per chunk; zpccl-model keeps it when a flag changes the bandwidth.
//
// Below that range NCCL switches protocols (LL, LL128) and the line extrapolated from 16 MiB up over-predicts it
// (over NVLink, a 4 MiB all-to-all runs well below the large line). So a link may carry a
// second line, fitted the same way from the NCCL rows below the large line's smallest size (smallBelowBytes). A
// collective below that size (its size as nccl-tests gives it: an all-gather's gathered tensor, a reduce-scatter's
// input, an all-to-all's n x bytes per peer) costs the lower of the two lines: NCCL runs the protocol its tuning
// predicts faster, and the small line, a ramp fitted from 1 - 4 MiB, must not be extrapolated where the large one
// is already the faster (two H200 over NVLink: an 8 MiB all-gather). smallBelowBytes 0: one line for every size.
struct LinkCost {
  double bwGBs = 0;
  double latencyUs = 0;
  double smallBelowBytes = 0;  // the small-message line applies below this size; 0: none
  double smallBwGBs = 0;
  double smallLatencyUs = 0;

  bool hasSmallLine() const { return smallBelowBytes > 0 && smallBwGBs > 0; }
  // The line of a collective of `size` bytes (nccl-tests' size) whose steps move `stepBytes` each: the large one,
  // or below smallBelowBytes the small one where a step costs less on it.
  LinkCost forSize(double size, double stepBytes) const;
};

// A class of link (intra-node: per GPU; inter-node: per node, all NICs together), per kind of collective, since
// NCCL reaches different speeds on each (over net, the all-to-all runs well below the all-gather).
struct LinkParams {
  LinkCost allGather;
  LinkCost reduceScatter;
  LinkCost allToAll;
  static LinkParams uniform(double bwGBs, double latencyUs);
};

// One kind of kernel: a fixed cost per launch plus its work over a rate. The work of quantize, dequantize and
// copy is the bytes they read + write (rate in GB/s); the reduce kernels' is the elements they decode and sum,
// sources x count (rate in G element-sources per second), whatever the bits (see "the formulas").
struct KernelCost {
  double rate = 1;
  double launchUs = 0;
};

// The kernels of this implementation, each at its own speed. Quantize has one cost per code width (quantizeCost):
// per byte read + written, int4 codes run slower than int8; dequantize's widths differ within its fit's error and
// share one cost. Defaults: the calibration of two H200 (bf16, zpccl-model --calibrate
// perf/results/2026-11-30-h200x2-nvlink-shm-nccl-pipeline.json, -net-nccl-pipeline.json and -baselines.json;
// perf/RESULTS.md, Cost model), rounded. The reduce rate is fitted with the links' small-message lines: without
// them the one-chunk 16 MiB qgZ rows would carry the large line's over-price of their 4 MiB all-to-all, which the
// reduce term would pay back.
struct KernelParams {
  KernelCost quantizeInt8{2630, 4.2};  // device/quantize.cu, int8 codes, GB/s of bytes read + written
  KernelCost quantizeInt4{2250, 4.7};  // device/quantize.cu, int4 codes, GB/s of bytes read + written
  KernelCost dequantize{3570, 1.3};    // device/quantize.cu, GB/s of bytes read + written
  KernelCost reduce{1380, 1.3};        // device/reduce.cu, G element-sources/s
  // NCCL's all-gather over one rank, out of place: a device copy; GB/s read + written. Also the copy that follows
  // qgZ's pair all-gather (PipelineParams::pairAllGather).
  KernelCost copy{4100, 11};

  // The quantize kernel's cost for codes of `bits` (4 or 8).
  const KernelCost& quantizeCost(int bits) const { return bits == 4 ? quantizeInt4 : quantizeInt8; }
  KernelCost& quantizeCost(int bits) { return bits == 4 ? quantizeInt4 : quantizeInt8; }
};

// The chunk pipeline of qwZ and qgZ (src/cuda/pipeline.h, host/chunk_plan.h): chunks of chunkBytes logical
// bytes, at most maxChunks (the library's defaults, ZP_CHUNK_BYTES and ZP_MAX_CHUNKS), and the share of an ideal
// pipeline's overlap that the implementation achieves, per op (0: the stages' times add up; 1: an ideal pipeline).
//
// The quantized gathers (qwZ, and hpZ with bits) run their quantize and dequantize kernels in a green context that
// leaves ncclSms SMs to NCCL (ZP_NCCL_SMS; the library's default, 32), so NCCL's CTAs can start beside them and the
// stages overlap far better (perf/RESULTS.md, Cost model): two
// configurations, each with its own overlap. Only whether ncclSms is zero matters to the model. The kernel rates
// are the same in both (fitted from the quantize and dequantize rows, which run on every SM): the green overlap,
// fitted from the green rows, absorbs what the smaller SM share and the shared HBM cost the stages, which is why
// it comes out below the traced overlap. qgZ never uses the green context (it quantizes all n slices
// and needs every SM). Default overlaps: the calibration of KernelParams' defaults, rounded; the green one with
// the green rows of perf/results/*-green-context.json added (tests/test_cost_model.cc, MeasuredGreenContext).
//
// qgZ's exchange between exactly two ranks (one hop on two GPUs; the inter-node hop of two hops over two nodes; the
// intra-node hop over two GPUs a node) may run as one NCCL all-gather of the slot each rank sends the other, plus a
// local copy of the slot it keeps (Exchange::kPairGather; ZP_PAIR_ALLGATHER): the same bytes on the wire, priced on
// the all-gather line instead of the all-to-all one (NCCL's sockets run the ring at ~3/2 the speed of their
// point-to-point). Which exchanges do is the library's plan (planOf); pairAllGather is its mode: 0 never, 1 always,
// 2 (the default) over a slow link, which on the model's links means the two ranks are on different nodes.
struct PipelineParams {
  double chunkBytes = 64.0 * 1024 * 1024;
  int maxChunks = 8;
  int ncclSms = 32;               // ZP_NCCL_SMS: 0 runs the gathers' kernels on every SM, else in a green context
  double qwzOverlap = 0.43;       // the quantized gathers with every SM (ZP_NCCL_SMS=0)
  double qwzGreenOverlap = 0.62;  // the quantized gathers in a green context (ZP_NCCL_SMS=32)
  double qgzOverlap = 0.60;
  int pairAllGather = 2;  // ZP_PAIR_ALLGATHER: 0 never, 1 always, 2 across nodes only (see above)

  bool greenContext() const { return ncclSms != 0; }
  // The overlap of the quantized gathers in the configuration ncclSms selects.
  double gatherOverlap() const { return greenContext() ? qwzGreenOverlap : qwzOverlap; }
};

struct ClusterSpec {
  std::vector<int> gpusPerNode;                      // one entry per node; unequal entries make an uneven layout
  LinkParams intra = LinkParams::uniform(270, 2);    // NVLink, per GPU (nccl-tests bf16 all-gather, two H200)
  LinkParams inter = LinkParams::uniform(12.5, 10);  // 100 Gb/s per node
  KernelParams kernel;
  PipelineParams pipeline;

  static ClusterSpec even(int nodes, int gpusPerNode);
  int nranks() const;
  int nodes() const { return static_cast<int>(gpusPerNode.size()); }
  bool isEven() const;
};

struct ZeroppOptions {
  bool qwz = true;           // forward weight all-gather quantized
  bool hpz = true;           // backward weight all-gather inside the hpZ group from the secondary shard
  bool qgz = true;           // gradient reduce-scatter by qgZ's all-to-alls
  bool qwzBackward = false;  // with hpZ off: quantize the backward gather too (DeepSpeed's qwZ without hpZ)
  int weightBits = 8;
  int gradBits = 4;
  int blockSize = 256;
  int hpzSize = 0;  // ranks per hpZ group; 0: the whole node
};

struct StepConfig {
  double params = 0;        // model parameters
  int elemBytes = 2;        // bf16 weights and gradients
  double bucketParams = 0;  // parameters per collective call (ZeRO's buckets); 0: one call for the whole model
  double computeMs = 0;     // forward + backward compute of one step on one GPU
  // Share of min(compute, comm) hidden by overlap: 0 gives step = compute + comm (nothing hidden, the
  // default), 1 gives step = max(compute, comm) (perfect prefetch).
  double overlap = 0;
};

// ---- results -----------------------------------------------------------------------------------------------

// What one collective (or a sum of them) costs.
struct Traffic {
  double intraBytes = 0;       // sent per GPU over intra-node links, averaged over GPUs
  double interBytes = 0;       // sent per GPU across nodes, averaged over GPUs (= node egress / L when even)
  double nodeEgressBytes = 0;  // leaving the busiest node (all its GPUs together)
  double kernelBytes = 0;      // read + written by the kernels of one GPU (quantize, dequantize, reduce, copy)
  double launches = 0;         // kernel launches of one GPU
  double linkUs = 0;           // bandwidth terms
  double latencyUs = 0;        // per-step terms of the links
  double kernelUs = 0;         // kernel terms
  double hiddenUs = 0;         // what the chunk pipeline overlaps (subtracted)
  double timeUs() const { return linkUs + latencyUs + kernelUs - hiddenUs; }
  Traffic& operator+=(const Traffic& o);
  Traffic scaled(double k) const;
};

struct CollectiveCost {
  std::string scheme;  // what runs, e.g. "qgZ int4, two hops"
  std::string note;    // a fallback and why; empty when the technique ran as asked
  int calls = 1;
  Traffic traffic;  // for all calls of the step
};

struct StepCost {
  CollectiveCost forward, backward, gradient;
  Traffic comm;  // the three together
  double computeUs = 0;
  double stepUs = 0;
  double crossNodeM = 0;  // exact cross-node volume per node per step, in units of M
};

// Cross-node volume per step in units of M with the paper's accounting: large-n limit, no block scales.
struct PaperVolume {
  double forward = 0, backward = 0, gradient = 0;
  double total() const { return forward + backward + gradient; }
};

struct Comparison {
  StepCost zero3, zeropp;
  double speedup = 0;  // ZeRO-3 step / ZeRO++ step
  PaperVolume paperZero3, paperZeropp;
  double modelBytes = 0;           // M
  double hpzSecondaryBytes = 0;    // per GPU memory of hpZ's secondary shard (0 without hpZ)
  std::vector<std::string> notes;  // fallbacks of the layout, in words
};

// ---- the model ---------------------------------------------------------------------------------------------

// The plan that the model prices for one call on this cluster: the library's (host/coll_plan.h, planCollective), as
// rank 0 sees the layout, with c.pipeline's tunables (chunk bytes and count, ZP_PAIR_ALLGATHER, a green context when
// ZP_NCCL_SMS is not 0) over NCCL's links: no host shared memory on extra channels, no direct loads, and the own
// slot never worked early (ZP_OWN_SLOT_EARLY_BYTES=-1), none of which the formulas price. count: the gathers'
// sendcount or qgZ's recvcount; hpzSize as hpzAllGatherCost's. path kNone when the cluster has no rank.
CollPlan planOf(const ClusterSpec& c, CollKind kind, double count, int elemBytes, int bits, int blockSize,
                int hpzSize = 0);

// Single collectives. bytes/count are those of one call; every function returns the cost of one call.
// Ring all-gather over every rank; totalBytes = the gathered tensor.
Traffic ringAllGatherCost(const ClusterSpec& c, double totalBytes);
// Ring reduce-scatter over every rank; totalBytes = each rank's input (the whole tensor).
Traffic ringReduceScatterCost(const ClusterSpec& c, double totalBytes);
// All-to-all over every rank, bytesPerPeer to each peer (nccl-tests' size = n * bytesPerPeer).
Traffic allToAllCost(const ClusterSpec& c, double bytesPerPeer);
// qwZ: count elements per rank (the shard), gathered as block-quantized payloads through the chunk pipeline.
Traffic qwzAllGatherCost(const ClusterSpec& c, double count, int elemBytes, int bits, int blockSize);
// hpZ: the full tensor (fullCount elements) gathered inside each hpZ group of hpzSize ranks (0: the node). A group
// of one rank copies the tensor (NCCL's all-gather over one rank, out of place). On an uneven layout hpZ is
// unavailable: the cost is the flat ring all-gather's and *note says so.
Traffic hpzAllGatherCost(const ClusterSpec& c, double fullCount, int elemBytes, int hpzSize, std::string* note);
// qgZ: recvcount elements per rank, through the chunk pipeline on its plan's path (planOf): two hops on a
// hierarchical layout (host/qgz_plan.h), else one, and *note says why.
Traffic qgzReduceScatterCost(const ClusterSpec& c, double recvcount, int elemBytes, int bits, int blockSize,
                             std::string* note);

// One step of each scheme, side by side. An error (bad layout or settings) comes back in *error, with a
// default Comparison.
Comparison compareStep(const ClusterSpec& c, const StepConfig& s, const ZeroppOptions& z, std::string* error);
StepCost stepCost(const ClusterSpec& c, const StepConfig& s, const ZeroppOptions& z, bool zeropp,
                  std::vector<std::string>* notes);
PaperVolume paperCrossNodeVolume(const ZeroppOptions& z, bool zeropp);
// Step time from compute and communication (see StepConfig::overlap).
double stepTimeUs(double computeUs, double commUs, double overlap);
// Checks a layout and settings; empty when usable.
std::string validate(const ClusterSpec& c, const StepConfig& s, const ZeroppOptions& z);

// ---- calibration from the perf binaries' JSON --------------------------------------------------------------

// Rows as tools/model/json_in.h reads them.
using perf::parsePerfJson;
using perf::PerfRow;

enum class RowKind {
  kUnknown,
  kNcclAllGather,
  kNcclReduceScatter,
  kNcclAllToAll,
  kQwz,
  kHpz,
  kQwzHpz,  // perf/hpz_perf.cc's qwz_hpz_gathers: a qwZ gather, then an hpZ gather, of the full tensor
  kQgz,
  kQuantize,
  kDequantize
};
RowKind classifyOp(const std::string& op);
const char* rowKindName(RowKind k);
// The ZP_NCCL_SMS a row ran with: its env's value; 0 when the row does not say (the perf binaries record every
// setting that chooses a path, perf/json_out.cc; a row that does not is from a build whose default ran without a
// green context).
int rowNcclSms(const PerfRow& row);
// The ZP_PAIR_ALLGATHER a row ran with: its env's value; 0 when the row does not say (a row without it comes from
// a build without the pair exchange, which used ncclSend/ncclRecv).
int rowPairAllGather(const PerfRow& row);
// Whether a qgZ row's exchanges include a pair's all-gather (in the plan of the row's call, layout and mode); false
// for every other row.
bool usesPairGather(const PerfRow& row);
// A row of a quantized gather (qwZ, the qwZ gather of qwz_hpz_gathers, hpZ with bits) run in a green context
// (rowNcclSms non-zero). Every other row (NCCL's, qgZ's, the kernels') runs the same whatever its ZP_NCCL_SMS.
bool isGreenContextRow(const PerfRow& row);

// A least-squares fit of time = latency * steps + bytes / bw.
struct FitPoint {
  double steps = 0;
  double bytes = 0;
  double timeUs = 0;
  double scaleUs = 0;  // the time the error is relative to (0: timeUs); a residual's fit uses the row's time
  double size = 0;     // the row's logical size (fitLargeRows keeps those from kFitMinBytes); 0: unknown
};
struct LinkFit {
  bool ok = false;
  LinkCost cost;
  int points = 0;
  double rmsErrPct = 0;  // relative error of the fit over its points
};
// Weighted by 1/time^2, i.e. it minimises the relative error, so small sizes pin the latency and large ones the
// bandwidth. Latency is kept >= 0; one distinct size gives latency 0.
LinkFit fitLatencyBandwidth(const std::vector<FitPoint>& points);
// The same fit over the points of size >= kFitMinBytes when they hold at least two distinct sizes, else over all
// of them: from 16 MiB up one bandwidth and one per-step cost describe NCCL and the kernels within a few percent,
// while below that launch and protocol floors would bend the fit (and the model is checked from 16 MiB up).
LinkFit fitLargeRows(const std::vector<FitPoint>& points);
// Both lines of a link (LinkCost): the large-message one (fitLargeRows) and, when that one was fitted from sizes
// >= kFitMinBytes only, a small-message one fitted the same way (fitLatencyBandwidth) from the points below the
// smallest size it was fitted from, used below that size (LinkCost::smallBelowBytes). Without two distinct sizes
// below it there is no small line: the large one serves every size. *small (may be null): the small fit as such.
LinkFit fitLinkRows(const std::vector<FitPoint>& points, LinkFit* small);

struct RegimeFit {
  LinkFit allGather, reduceScatter, allToAll;  // as fitted (ok false when that kind had no rows), both lines
  LinkFit smallAllGather, smallReduceScatter, smallAllToAll;  // their small-message lines (ok false: none)
  LinkParams link;                                            // with missing kinds borrowed from the others
  bool ok = false;
};

// Which call a check is about: the same call measured in several files has the same CheckedCall (a row's check,
// then the point that averages its repeats).
struct CheckedCall {
  std::string what;  // op, or "op (nccl baseline)"
  std::string regime, type;
  double size = 0;
  int ranks = 0, nodes = 0, bits = 0, block = 0;  // bits, block: the row's (0 when it does not say)
  // The configuration the model priced it in (rowConfiguration); empty for an NCCL baseline, which runs the same
  // whatever the row's settings.
  std::string config;

  // Ordered field by field, so that the repeats of one call can be found (averagePoints).
  bool operator<(const CheckedCall& o) const {
    return std::tie(what, regime, type, size, ranks, nodes, bits, block, config) <
           std::tie(o.what, o.regime, o.type, o.size, o.ranks, o.nodes, o.bits, o.block, o.config);
  }
};

struct RowCheck : CheckedCall {
  size_t row = 0;         // index in the rows
  bool baseline = false;  // the NCCL collective(s) measured next to a zpccl row
  double measuredUs = 0, predictedUs = 0, errPct = 0;
  bool flagged = false;  // size >= kCheckMinBytes and |error| > kCheckMaxErrPct
};
constexpr double kCheckMinBytes = 16.0 * 1024 * 1024;
constexpr double kCheckMaxErrPct = 15.0;
constexpr double kFitMinBytes = kCheckMinBytes;

// One measured point: the checks of the same (what, regime, type, size, bits, block, nodes, ranks, config), i.e.
// the same call measured in several files, averaged (an NCCL baseline's bits and block are not its call's: its
// point has 0 for both, and takes in the baselines of the rows of either width). The model predicts every repeat
// alike; the repeats themselves may disagree (the net regime's loopback sockets: up to ~25% between runs), which
// the per-row check counts as misses of the model. The per-row check stays the headline; this one says how much of
// it is the runs' noise.
struct PointCheck : CheckedCall {
  int repeats = 0;                     // rows averaged
  double measuredUs = 0;               // their mean
  double minUs = 0, maxUs = 0;         // their spread
  double predictedUs = 0, errPct = 0;  // the model against the mean
  bool flagged = false;                // size >= kCheckMinBytes and |error| > kCheckMaxErrPct
};
// The checks grouped into measured points, in the order of each point's first check.
std::vector<PointCheck> averagePoints(const std::vector<RowCheck>& checks);
// The configuration a row runs in, as the model distinguishes it: "green context" (isGreenContextRow), "pair
// all-gather" (usesPairGather), or empty.
std::string rowConfiguration(const PerfRow& row);

// The fit of one model parameter (or two) from rows: how many, and how well the model then describes them.
struct ParamFit {
  bool ok = false;
  int points = 0;
  double rmsErrPct = 0;
};

struct Calibration {
  std::map<std::string, RegimeFit> regimes;
  KernelParams kernel;      // fitted kinds replaced, the others as given
  PipelineParams pipeline;  // fitted overlaps replaced
  ParamFit quantizeInt8Fit, quantizeInt4Fit, dequantizeFit, copyFit, reduceFit, qwzOverlapFit, qwzGreenOverlapFit,
      qgzOverlapFit;
  bool kernelFitted = false;  // any of the kernel or overlap fits succeeded
  int greenRows = 0;          // rows run in a green context (isGreenContextRow)
  std::vector<RowCheck> checks;
  std::vector<std::string> notes;
  int flagged = 0;                 // checks flagged: the headline count
  std::vector<PointCheck> points;  // the checks averaged per measured point (averagePoints)
  int pointsFlagged = 0;
};

// Fits, in this order (each from rows of kFitMinBytes and up, see fitLargeRows):
//   1. each regime's links, per kind of collective, from its NCCL rows (nccl_* ops, and the NCCL baselines of
//      zpccl rows: one all-gather for qwZ and hpZ, two for qwz_hpz_gathers, one reduce-scatter for qgZ), with
//      each kind's small-message line from its rows below 16 MiB (fitLinkRows). No qgZ row's own time enters these
//      fits: its exchange is priced in step 4 on the line it ran on (the all-to-all's, or the all-gather's where
//      the row's ZP_PAIR_ALLGATHER made a pair gather), so the all-to-all lines are NCCL's all-to-all alone;
//   2. the quantize kernel per code width from the quantize rows ("local") of that width, the dequantize kernel
//      from the dequantize rows, the copy from the hpZ rows whose hpZ group is one rank;
//   3. qwZ's pipeline overlap in each configuration (least squares, closed form): qwzOverlap from the qwZ rows run
//      with every SM, qwzGreenOverlap from those run in a green context (isGreenContextRow), the kernels shared;
//   4. the reduce kernel's rate and qgZ's pipeline overlap from the qgZ rows (a search over the rate, the overlap
//      in closed form at each), the reduce launch cost taken from the dequantize fit;
// then predicts every row (zpccl rows and their baselines; each in its own configuration), flagging misses, and
// averages the checks per measured point (averagePoints), flagging those too.
// Kinds without rows keep the `defaults` (a note says so); when there are green rows, a note gives their count
// and the overlap of each configuration.
Calibration calibrate(const std::vector<PerfRow>& rows, const KernelParams& defaults,
                      const PipelineParams& pipelineDefaults = PipelineParams());
// The model's time for a row's op (baseline: the NCCL collective(s) measured next to it), with every link of the
// row's layout set to `link`, in the row's configuration (rowNcclSms, rowPairAllGather; pipeline.ncclSms and
// pipeline.pairAllGather are not used). Negative when the row cannot be predicted (unknown op, no rank count).
double predictRowUs(const PerfRow& row, bool baseline, const LinkParams& link, const KernelParams& kernel,
                    const PipelineParams& pipeline = PipelineParams());

}  // namespace zp
