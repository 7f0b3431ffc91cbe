// The perf harness proper: processes and rank threads, communicators, the size sweep, timing, checking, the
// table and the JSON rows. Op files only fill a PerfOp (perf/common.h).
#include "perf/common.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "host/dtype.h"
#include "host/topology.h"
#include "perf/json_out.h"
#include "perf/options.h"
#include "perf/proc_group.h"
#include "perf/provenance.h"
#include "perf/rank_layout.h"
#ifdef ZP_PERF_MPI
#include "include/zpccl_mpi.h"
#endif

namespace zp {
namespace perf {

namespace {

ProcGroup* gGroup = nullptr;

[[noreturn]] void die() {
  if (gGroup != nullptr) gGroup->abort(1);
  std::fflush(nullptr);
  std::_Exit(1);
}

// Harness-side checks: a failed call ends the whole run (peers would wait forever in the collective).
#define H_CUDA(call)                                                 \
  do {                                                               \
    cudaError_t hErr_ = (call);                                      \
    if (hErr_ != cudaSuccess) {                                      \
      ::zp::perf::reportCudaError(hErr_, #call, __FILE__, __LINE__); \
      die();                                                         \
    }                                                                \
  } while (0)
#define H_NCCL(comm, call)                                                   \
  do {                                                                       \
    ncclResult_t hRes_ = (call);                                             \
    if (hRes_ != ncclSuccess) {                                              \
      ::zp::perf::reportNcclError(hRes_, (comm), #call, __FILE__, __LINE__); \
      die();                                                                 \
    }                                                                        \
  } while (0)
#define H_ZP(comm, call)                                                   \
  do {                                                                     \
    zpResult_t hRes_ = (call);                                             \
    if (hRes_ != zpSuccess) {                                              \
      ::zp::perf::reportZpError(hRes_, (comm), #call, __FILE__, __LINE__); \
      die();                                                               \
    }                                                                      \
  } while (0)

[[noreturn]] void fatal(const std::string& message) {
  std::fprintf(stderr, "zpccl perf: %s\n", message.c_str());
  die();
}

// Host memory aligned like device allocations (payloads need 16 bytes; pages help memcpy).
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { std::free(ptr_); }
  void reserve(size_t bytes) {
    if (bytes <= capacity_ && ptr_ != nullptr) return;
    std::free(ptr_);
    const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    ptr_ = std::aligned_alloc(4096, rounded);
    if (ptr_ == nullptr) fatal("out of host memory (" + formatBytes(rounded) + ")");
    capacity_ = rounded;
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};

class ThreadBarrier {
 public:
  explicit ThreadBarrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned long long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation != generation_; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_;
  int arrived_ = 0;
  unsigned long long generation_ = 0;
};

// Per op: the flags resolved against the op's defaults.
struct OpPlan {
  zpDataType_t type = zpBfloat16;
  zpRedOp_t redOp = zpSum;
  int bits = 0;
  int block = 0;
  bool inPlace = false;
  bool baseline = false;
  bool wire = false;
  bool check = false;
  int rounds = 1;  // timed rounds of each variant but the in-place one (-r, or its default)
};

// The measured variants of one size, in the order a round runs them (the in-place one in the first round only).
enum Variant { kOop = 0, kIp = 1, kBaseline = 2, kMatched = 3, kVariants = 4 };

// One rank's results for one size: each round's time of each variant (seconds per call) and wrong elements.
// Starts as "not run"; sent between processes as bytes (gatherLocal), so it stays trivially copyable.
struct SlotResult {
  static constexpr double kNotRun = std::numeric_limits<double>::quiet_NaN();
  SlotResult() {
    for (auto& variant : seconds) std::fill(std::begin(variant), std::end(variant), kNotRun);
    std::fill(std::begin(enqueue), std::end(enqueue), kNotRun);
  }
  double seconds[kVariants][kMaxRounds];
  double enqueue[kVariants];  // of those seconds, the host's time to enqueue one call (mean over the rounds)
  uint64_t wrong[2] = {0, 0};
  uint64_t checked = 0;  // nonzero when wrong[] was measured
};
static_assert(std::is_trivially_copyable_v<SlotResult>, "gatherLocal sends SlotResult as bytes");

struct OpStats {
  double busbwSum = 0;
  int busbwCount = 0;
  double logSpeedupSum = 0;
  int speedupCount = 0;
  uint64_t wrong = 0;
  bool checked = false;
};

constexpr size_t kLineBytes = 320;

// State shared by the rank threads of this process; the rank layout (perf/rank_layout.h) is its base.
struct Runtime : RankLayout {
  std::vector<PerfOp> ops;           // the binary's ops that this run measures
  std::vector<std::string> leftOut;  // ops not run (device kernels only, on the host backend)
  std::vector<OpPlan> plans;
  Options opt;
  ProcGroup* group = nullptr;
  bool host = false;
  bool hostOverMpi = false;  // the host backend's ranks are MPI processes, one a process (libzpccl_mpi's transport)
  bool needNccl = false;
  bool needZp = false;
  bool ncclBaseline = false;  // some op's baseline is NCCL: it is also run with zpccl's settings (ncclChannels)
  NcclChannels ncclChannels;  // what zpccl's communicators get, once the layout is known (rank thread 0)
  Provenance provenance;      // process 0: how the JSON's rows are made
  ncclUniqueId ncclId;
  zpUniqueId zpId;
  // Meeting key of the host-backend reference communicators; one per process, reused size after size (a
  // host world releases its id once complete).
  zpUniqueId hostRefId;
  std::vector<size_t> sizes;
  std::unique_ptr<ThreadBarrier> barrier;
  std::vector<SlotResult> slots;
  std::vector<int> slotInt;
  std::vector<std::string> slotLine;
  std::vector<HostBuffer*> expected;  // per local rank: where the host-backend hook writes
  std::vector<ResultRow> rows;
  std::vector<OpStats> stats;
  bool anyWrong = false;
  std::string program;
};

struct RankState {
  int t = 0;
  int rank = 0;
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  ncclComm_t nccl = nullptr;
  ncclComm_t ncclMatched = nullptr;  // NCCL with zpccl's communicators' settings (rt.ncclChannels), when any
  zpComm_t comm = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
  void* scratch = nullptr;
  HostBuffer hostSend, hostRecv, hostExpected;
  HostBuffer hostBufs[3];  // buffers of the host backend (send, recv, scratch)
};

// All ranks of all processes meet: thread barrier, one thread per process crosses processes, barrier again.
void fullBarrier(Runtime& rt, int t) {
  rt.barrier->wait();
  if (t == 0 && rt.group->size() > 1) {
    std::string error;
    if (!rt.group->barrier(&error)) fatal("process barrier: " + error);
  }
  rt.barrier->wait();
}

// Process-level all-gather of per-local-rank records, done by thread 0 (others wait at the barriers).
template <class T>
std::vector<T> gatherLocal(Runtime& rt, const std::vector<T>& local) {
  std::vector<T> padded(static_cast<size_t>(rt.maxLocalRanks));
  std::copy(local.begin(), local.end(), padded.begin());
  std::vector<T> all(padded.size() * size_t(rt.group->size()));
  std::string error;
  if (!rt.group->allGather(padded.data(), padded.size() * sizeof(T), all.data(), &error))
    fatal("exchange between processes: " + error);
  return all;
}

// ---- buffers on either backend -----------------------------------------------------------------------------

void* allocBuffer(Runtime& rt, RankState& st, int which, size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  if (rt.host) {
    st.hostBufs[which].reserve(bytes);
    return st.hostBufs[which].get();
  }
  void* p = nullptr;
  H_CUDA(cudaMalloc(&p, bytes));
  return p;
}

void freeBuffer(Runtime& rt, void* p) {
  if (!rt.host && p != nullptr) H_CUDA(cudaFree(p));
}

void upload(Runtime& rt, RankState& st, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (rt.host) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // On our stream (non-blocking), so that it is ordered with the poison memset and the runs.
  H_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st.stream));
  H_CUDA(cudaStreamSynchronize(st.stream));
}

void download(Runtime& rt, RankState& st, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (rt.host) {
    std::memcpy(dst, src, bytes);
    return;
  }
  H_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st.stream));
  H_CUDA(cudaStreamSynchronize(st.stream));
}

// Fills outputs with 0xff (NaN for floating types) so that an op that writes nothing cannot pass the check
// with an earlier size's results.
void poison(Runtime& rt, RankState& st, void* dst, size_t bytes) {
  if (bytes == 0) return;
  if (rt.host) {
    std::memset(dst, 0xff, bytes);
    return;
  }
  H_CUDA(cudaMemsetAsync(dst, 0xff, bytes, st.stream));
  H_CUDA(cudaStreamSynchronize(st.stream));
}

// ---- sizes and runs ----------------------------------------------------------------------------------------

SizeArgs makeSizeArgs(const Runtime& rt, const PerfOp& op, const OpPlan& plan, size_t bytes, int rank) {
  SizeArgs s;
  s.op = &op;
  s.bytes = bytes;
  s.type = plan.type;
  s.redOp = plan.redOp;
  s.bits = plan.bits;
  s.blockSize = plan.block;
  s.rank = rank;
  s.nranks = rt.nranks;
  s.nodes = rt.nodes;
  s.nodeOf = rt.nodeOf.data();
  s.stochastic = rt.opt.stochastic != 0;
  s.feedback = rt.opt.feedback != 0;
  return s;
}

RunArgs makeRunArgs(const Runtime& rt, const RankState& st, const SizeArgs& s, const OpCounts& c, const void* send,
                    void* recv, bool inPlace) {
  RunArgs a;
  a.size = &s;
  a.counts = &c;
  a.send = send;
  a.recv = recv;
  a.scratch = st.scratch;
  a.inPlace = inPlace;
  a.backend = rt.host ? zpBackendHost : zpBackendCuda;
  a.comm = st.comm;
  a.nccl = st.nccl;
  a.stream = st.stream;
  return a;
}

size_t inPlaceBytes(const OpCounts& c) { return std::max(c.ipSendOffset + c.sendBytes, c.ipRecvOffset + c.recvBytes); }

// Seconds per call: `warmup` untimed calls, every rank at a barrier, then `iters` calls between two events.
// `*enqueue` gets the host's seconds per call spent enqueuing them: when it is as long as the call, the host, not
// the GPU, sets the pace (small messages).
double timeRun(Runtime& rt, RankState& st, RunFn fn, const RunArgs& a, double* enqueue) {
  for (int i = 0; i < rt.opt.warmup; ++i)
    if (!fn(a)) die();
  if (!rt.host) H_CUDA(cudaStreamSynchronize(st.stream));
  fullBarrier(rt, st.t);
  if (rt.host) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rt.opt.iters; ++i)
      if (!fn(a)) die();
    const auto t1 = std::chrono::steady_clock::now();
    *enqueue = std::chrono::duration<double>(t1 - t0).count() / rt.opt.iters;
    return *enqueue;
  }
  H_CUDA(cudaEventRecord(st.start, st.stream));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < rt.opt.iters; ++i)
    if (!fn(a)) die();
  *enqueue = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / rt.opt.iters;
  H_CUDA(cudaEventRecord(st.stop, st.stream));
  H_CUDA(cudaEventSynchronize(st.stop));
  float ms = 0;
  H_CUDA(cudaEventElapsedTime(&ms, st.start, st.stop));
  return double(ms) * 1e-3 / rt.opt.iters;
}

// The expected outputs of a zpccl collective: the same op run on a host-backend communicator of nranks
// thread-ranks, with the measured communicator's node layout, over the same deterministic inputs. Every
// process computes all ranks (inputs are cheap to regenerate) and keeps its own ranks' outputs.
void expectedOnHostBackend(Runtime& rt, const PerfOp& op, const OpPlan& plan, size_t bytes) {
  std::vector<std::thread> threads;
  for (int r = 0; r < rt.nranks; ++r) {
    threads.emplace_back([&rt, &op, &plan, bytes, r] {
      setReportRank(r);
      const SizeArgs s = makeSizeArgs(rt, op, plan, bytes, r);
      OpCounts c;
      op.counts(s, &c);
      HostBuffer send, recv, scratch;
      send.reserve(c.sendBytes);
      recv.reserve(c.recvBytes);
      scratch.reserve(c.scratchBytes);
      op.init(s, c, send.get());
      zpConfig_t config = ZP_CONFIG_INITIALIZER;
      config.backend = zpBackendHost;
      config.nodeId = rt.nodeOf[size_t(r)];
      if (plan.bits > 0) {
        config.weightBits = plan.bits;
        config.gradBits = plan.bits;
        config.blockSize = plan.block;
      }
      zpComm_t comm = nullptr;
      H_ZP(nullptr, zpCommInitRankConfig(&comm, rt.nranks, rt.hostRefId, r, &config));
      RunArgs a;
      a.size = &s;
      a.counts = &c;
      a.send = send.get();
      a.recv = recv.get();
      a.scratch = scratch.get();
      a.backend = zpBackendHost;
      a.comm = comm;
      if (op.reset && !op.reset(a)) die();
      if (!op.run(a)) die();
      if (r >= rt.rankBase && r < rt.rankBase + rt.localRanks)
        std::memcpy(rt.expected[size_t(r - rt.rankBase)]->get(), recv.get(), c.recvBytes);
      H_ZP(comm, zpCommDestroy(comm));
    });
  }
  for (auto& th : threads) th.join();
}

// ---- the table ---------------------------------------------------------------------------------------------

std::string fmt(const char* format, double v) {
  if (!std::isfinite(v)) return "N/A";
  char buf[48];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string fmtTime(double us) { return fmt(us < 1e6 ? "%.2f" : "%.0f", us); }

std::string cols(const std::vector<std::pair<int, std::string>>& cells) {
  std::string line;
  char buf[128];
  for (const auto& cell : cells) {
    std::snprintf(buf, sizeof(buf), " %*s", cell.first, cell.second.c_str());
    line += buf;
  }
  return line;
}

// Widths: key columns, a measured variant, the baseline, the matched NCCL baseline, the wire bytes.
const int kKey[] = {12, 12, 9, 6, 5};
const int kMeasure[] = {11, 9, 9, 7};
const int kBase[] = {11, 9, 8, 12};
const int kMatchedCols[] = {11, 8};
const int kWire[] = {11, 11, 11, 11, 8};

// Whether an op's table has the column group of NCCL with zpccl's settings.
bool hasMatched(const Runtime& rt, const OpPlan& plan, const PerfOp& op) {
  return plan.baseline && (op.baselineUses & kUsesNccl) && rt.ncclChannels.any();
}

std::string channelsText(const NcclChannels& c) {
  std::string text;
  if (c.minCtas > 0) text += "min " + std::to_string(c.minCtas) + " / max " + std::to_string(c.maxCtas) + " CTAs";
  if (c.netChannelsPerPeer > 0)
    text += (text.empty() ? "" : ", ") + std::to_string(c.netChannelsPerPeer) + " channels per net peer";
  return text;
}

int groupWidth(const int* w, int n) {
  int total = 0;
  for (int i = 0; i < n; ++i) total += w[i] + 1;
  return total;
}

void printTableHeader(const Runtime& rt, const PerfOp& op, const OpPlan& plan) {
  std::printf("#\n# %s: type %s%s%s", op.name, typeName(plan.type), op.reduces ? ", op " : "",
              op.reduces ? opName(plan.redOp) : "");
  if (plan.bits > 0) std::printf(", bits %d, block %d", plan.bits, plan.block);
  if (rt.opt.stochastic || rt.opt.feedback) {
    std::printf(", gradient rounding: %s%s", rt.opt.stochastic ? "stochastic" : "nearest",
                rt.opt.feedback ? " + error feedback" : "");
  }
  std::printf(", runs %s, baseline %s, check %s, rounds %d\n", op.runLabel, plan.baseline ? op.baselineName : "none",
              plan.check ? "host reference" : (rt.opt.check ? "none available" : "off (-c 0)"), plan.rounds);
  const bool matched = hasMatched(rt, plan, op);
  if (plan.baseline && (op.baselineUses & kUsesNccl)) {
    std::printf(
        "#  times: medians over the rounds; speedup = NCCL's median / zpccl's, and the least and greatest of "
        "the rounds' own ratios\n");
    std::printf("#  zpccl's NCCL communicators get %s\n",
                matched
                    ? (channelsText(rt.ncclChannels) + ": the \"nccl matched\" columns run NCCL with them too").c_str()
                    : "NCCL's defaults, as the baseline does");
  }
  // Group titles, right-aligned over their columns.
  std::string titles = "#" + std::string(size_t(groupWidth(kKey, 5)) - 1, ' ');
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%*s", groupWidth(kMeasure, 4), "out-of-place");
  titles += buf;
  if (plan.inPlace) {
    std::snprintf(buf, sizeof(buf), "%*s", groupWidth(kMeasure, 4), "in-place");
    titles += buf;
  }
  if (plan.baseline) {
    std::snprintf(buf, sizeof(buf), "%*s", groupWidth(kBase, 4), (std::string(op.baselineName) + " oop").c_str());
    titles += buf;
  }
  if (matched) {
    std::snprintf(buf, sizeof(buf), "%*s", groupWidth(kMatchedCols, 2), "nccl matched");
    titles += buf;
  }
  if (plan.wire) {
    std::snprintf(buf, sizeof(buf), "%*s", groupWidth(kWire, 5), "MB sent per rank: zpccl / nccl ring");
    titles += buf;
  }
  std::printf("%s\n", titles.c_str());
  auto names = [&](bool units) {
    std::string line = "#";
    std::vector<std::pair<int, std::string>> c;
    const char* key[] = {"size", "count", "type", "redop", "bits"};
    const char* keyUnits[] = {"(B)", "(elements)", "", "", ""};
    for (int i = 0; i < 5; ++i) c.push_back({kKey[i], units ? keyUnits[i] : key[i]});
    const char* m[] = {"time", "algbw", "busbw", "#wrong"};
    const char* mUnits[] = {"(us)", "(GB/s)", "(GB/s)", ""};
    for (int v = 0; v < (plan.inPlace ? 2 : 1); ++v)
      for (int i = 0; i < 4; ++i) c.push_back({kMeasure[i], units ? mUnits[i] : m[i]});
    if (plan.baseline) {
      const char* b[] = {"time", "busbw", "speedup", "rounds"};
      const char* bUnits[] = {"(us)", "(GB/s)", "(x)", "(min-max)"};
      for (int i = 0; i < 4; ++i) c.push_back({kBase[i], units ? bUnits[i] : b[i]});
    }
    if (matched) {
      const char* b[] = {"time", "speedup"};
      const char* bUnits[] = {"(us)", "(x)"};
      for (int i = 0; i < 2; ++i) c.push_back({kMatchedCols[i], units ? bUnits[i] : b[i]});
    }
    if (plan.wire) {
      const char* w[] = {"zp-intra", "zp-inter", "ring-intra", "ring-inter", "ring/zp"};
      const char* wUnits[] = {"(MB)", "(MB)", "(MB)", "(MB)", "(x)"};
      for (int i = 0; i < 5; ++i) c.push_back({kWire[i], units ? wUnits[i] : w[i]});
    }
    line += cols(c).substr(1);
    line.erase(line.find_last_not_of(' ') + 1);
    std::printf("%s\n", line.c_str());
  };
  names(false);
  names(true);
}

std::string fmtWrong(const Measure& m) { return m.checked ? std::to_string(m.wrong) : "N/A"; }

void printRow(const ResultRow& row, const OpPlan& plan, bool matched) {
  std::vector<std::pair<int, std::string>> c = {
      {kKey[0], std::to_string(row.size)},
      {kKey[1], std::to_string(row.count)},
      {kKey[2], row.type},
      {kKey[3], row.redop.empty() ? "none" : row.redop},
      {kKey[4], row.bits > 0 ? std::to_string(row.bits) : "-"},
  };
  for (const Measure* m : {&row.oop, &row.ip}) {
    if (m == &row.ip && !plan.inPlace) continue;
    if (m->present) {
      c.push_back({kMeasure[0], fmtTime(m->timeUs)});
      c.push_back({kMeasure[1], fmt("%.2f", m->algbw)});
      c.push_back({kMeasure[2], fmt("%.2f", m->busbw)});
      c.push_back({kMeasure[3], fmtWrong(*m)});
    } else {
      for (int i = 0; i < 4; ++i) c.push_back({kMeasure[i], i == 0 ? "N/A" : ""});
    }
  }
  if (plan.baseline) {
    c.push_back({kBase[0], fmtTime(row.baseline.timeUs)});
    c.push_back({kBase[1], fmt("%.2f", row.baseline.busbw)});
    c.push_back({kBase[2], fmt("%.3f", row.speedup)});
    c.push_back({kBase[3], row.baseline.roundsUs.size() > 1
                               ? fmt("%.2f", row.speedupMin) + "-" + fmt("%.2f", row.speedupMax)
                               : std::string("-")});
  }
  if (matched) {
    c.push_back({kMatchedCols[0], fmtTime(row.matched.timeUs)});
    c.push_back({kMatchedCols[1], fmt("%.3f", row.speedupMatched)});
  }
  if (plan.wire) {
    c.push_back({kWire[0], fmt("%.3f", row.zpWire.intra / 1e6)});
    c.push_back({kWire[1], fmt("%.3f", row.zpWire.inter / 1e6)});
    c.push_back({kWire[2], fmt("%.3f", row.ringWire.intra / 1e6)});
    c.push_back({kWire[3], fmt("%.3f", row.ringWire.inter / 1e6)});
    const double ratio =
        row.zpWire.inter > 0 ? row.ringWire.inter / row.zpWire.inter : std::numeric_limits<double>::quiet_NaN();
    c.push_back({kWire[4], fmt("%.2f", ratio)});
  }
  std::printf(" %s\n", cols(c).substr(1).c_str());
}

double nanMax(double a, double b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  return std::max(a, b);
}

// Every rank's results as one: each round's time is its slowest rank's (the ranks start a round together, after
// a barrier), the wrong elements are summed.
SlotResult reduceSlots(const SlotResult* slots, size_t n) {
  SlotResult r;
  for (size_t i = 0; i < n; ++i) {
    for (int k = 0; k < kVariants; ++k)
      for (int round = 0; round < kMaxRounds; ++round)
        r.seconds[k][round] = nanMax(r.seconds[k][round], slots[i].seconds[k][round]);
    for (int k = 0; k < kVariants; ++k) r.enqueue[k] = nanMax(r.enqueue[k], slots[i].enqueue[k]);
    r.wrong[0] += slots[i].wrong[0];
    r.wrong[1] += slots[i].wrong[1];
    r.checked |= slots[i].checked;
  }
  return r;
}

double medianOf(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// The rounds a variant ran, in seconds per call.
std::vector<double> roundsOf(const SlotResult& r, int variant) {
  std::vector<double> out;
  for (double s : r.seconds[variant])
    if (!std::isnan(s)) out.push_back(s);
  return out;
}

// A variant's measure: the median of its rounds, each round kept (in microseconds).
void fillMeasure(const SlotResult& r, int variant, Measure* m) {
  const std::vector<double> rounds = roundsOf(r, variant);
  m->present = !rounds.empty();
  if (!m->present) return;
  m->timeUs = medianOf(rounds) * 1e6;
  m->enqueueUs = r.enqueue[variant] * 1e6;
  for (double s : rounds) m->roundsUs.push_back(s * 1e6);
}

// The least and the greatest of the rounds' own ratios, baseline time / zpccl's, of the rounds both ran.
void roundRatios(const SlotResult& r, int baseline, double* lo, double* hi) {
  *lo = std::numeric_limits<double>::infinity();
  *hi = -*lo;
  for (int round = 0; round < kMaxRounds; ++round) {
    const double zp = r.seconds[kOop][round], base = r.seconds[baseline][round];
    if (std::isnan(zp) || std::isnan(base)) continue;
    *lo = std::min(*lo, base / zp);
    *hi = std::max(*hi, base / zp);
  }
}

// Thread 0: combine the ranks' results of one size, print the row, write the JSON.
void reportSize(Runtime& rt, size_t opIndex, const SizeArgs& s, const OpCounts& c) {
  const PerfOp& op = rt.ops[opIndex];
  const OpPlan& plan = rt.plans[opIndex];
  std::vector<SlotResult> local(rt.slots.begin(), rt.slots.begin() + rt.localRanks);
  // Pad with "absent" records so that every process sends the same number of bytes.
  local.resize(size_t(rt.maxLocalRanks), SlotResult());
  const std::vector<SlotResult> all = gatherLocal(rt, local);
  const SlotResult r = reduceSlots(all.data(), all.size());

  ResultRow row;
  row.op = op.name;
  row.regime = rt.opt.regime;
  if (rt.opt.stochastic || rt.opt.feedback) {
    row.grad = rt.opt.stochastic && rt.opt.feedback ? "sr+ef" : rt.opt.stochastic ? "sr" : "ef";
  }
  row.backend = rt.host ? "host" : "cuda";
  row.size = c.bytes;
  row.count = c.count;
  row.type = typeName(plan.type);
  row.redop = op.reduces ? opName(plan.redOp) : "";
  row.bits = plan.bits;
  row.block = plan.block;
  row.ranks = rt.nranks;
  row.nodes = rt.nodes;
  static const auto tunables = zpTunablesInEnvironment();
  row.env = tunables;
  Measure* measures[2] = {&row.oop, &row.ip};
  for (int v = 0; v < 2; ++v) {
    Measure& m = *measures[v];
    fillMeasure(r, v, &m);
    if (!m.present) continue;
    op.bw(s, c, m.timeUs * 1e-6, &m.algbw, &m.busbw);
    m.checked = r.checked != 0;
    m.wrong = r.wrong[v];
  }
  const BwFn baselineBw = op.baselineBw ? op.baselineBw : op.bw;
  if (plan.baseline) fillMeasure(r, kBaseline, &row.baseline);
  if (row.baseline.present) {
    row.baselineName = op.baselineName;
    baselineBw(s, c, row.baseline.timeUs * 1e-6, &row.baseline.algbw, &row.baseline.busbw);
    row.speedup = row.baseline.timeUs / row.oop.timeUs;
    roundRatios(r, kBaseline, &row.speedupMin, &row.speedupMax);
    if (op.baselineUses & kUsesNccl) row.ncclConfig = rt.ncclChannels;
  }
  if (hasMatched(rt, plan, op)) {
    fillMeasure(r, kMatched, &row.matched);
    if (row.matched.present) {
      baselineBw(s, c, row.matched.timeUs * 1e-6, &row.matched.algbw, &row.matched.busbw);
      row.speedupMatched = row.matched.timeUs / row.oop.timeUs;
    }
  }
  if (plan.wire) {
    row.hasWire = true;
    row.zpWire = op.wire(s, c);
    if (op.ringWire) row.ringWire = op.ringWire(s, c);
  }

  OpStats& st = rt.stats[opIndex];
  for (const Measure* m : measures)
    if (m->present && c.bytes > 0) {
      st.busbwSum += m->busbw;
      ++st.busbwCount;
    }
  if (row.baseline.present && c.bytes > 0 && row.speedup > 0 && std::isfinite(row.speedup)) {
    st.logSpeedupSum += std::log(row.speedup);
    ++st.speedupCount;
  }
  st.wrong += r.wrong[0] + r.wrong[1];
  st.checked = st.checked || r.checked != 0;
  if (r.wrong[0] + r.wrong[1] > 0) rt.anyWrong = true;

  if (rt.group->rank() != 0) return;
  printRow(row, plan, hasMatched(rt, plan, op));
  rt.rows.push_back(row);
  if (!rt.opt.json.empty()) {
    std::string error;
    if (!writeJsonFile(rt.opt.json, rt.provenance, rt.rows, &error)) fatal(error);
  }
}

void printOpFooter(const Runtime& rt, size_t opIndex) {
  if (rt.group->rank() != 0) return;
  const OpStats& st = rt.stats[opIndex];
  const PerfOp& op = rt.ops[opIndex];
  if (st.checked)
    std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(st.wrong),
                st.wrong ? "FAILED" : "OK");
  else
    std::printf("# Out of bounds values : 0 OK (not checked)\n");
  std::printf("# Avg bus bandwidth    : %g\n", st.busbwCount ? st.busbwSum / st.busbwCount : 0.0);
  if (st.speedupCount)
    std::printf("# Avg speedup vs %-6s: %.3f (geometric mean over sizes, out of place)\n", op.baselineName,
                std::exp(st.logSpeedupSum / st.speedupCount));
}

// ---- one op over the sweep, in one rank thread -------------------------------------------------------------

void runOp(Runtime& rt, RankState& st, size_t opIndex) {
  const PerfOp& op = rt.ops[opIndex];
  const OpPlan& plan = rt.plans[opIndex];

  // Buffers for the largest point of the sweep.
  size_t sendMax = 0, recvMax = 0, scratchMax = 0, outMax = 0;
  for (size_t bytes : rt.sizes) {
    OpCounts c;
    op.counts(makeSizeArgs(rt, op, plan, bytes, st.rank), &c);
    sendMax = std::max(sendMax, c.sendBytes);
    recvMax = std::max(recvMax, c.recvBytes);
    if (plan.inPlace) recvMax = std::max(recvMax, inPlaceBytes(c));
    outMax = std::max(outMax, c.recvBytes);
    scratchMax = std::max(scratchMax, c.scratchBytes);
  }
  st.send = allocBuffer(rt, st, 0, sendMax);
  st.recv = allocBuffer(rt, st, 1, recvMax);
  st.scratch = allocBuffer(rt, st, 2, scratchMax);
  st.hostSend.reserve(sendMax);
  if (plan.check) {
    st.hostRecv.reserve(outMax);
    st.hostExpected.reserve(outMax);
  }

  if (st.t == 0 && rt.group->rank() == 0) printTableHeader(rt, op, plan);
  fullBarrier(rt, st.t);

  for (size_t bytes : rt.sizes) {
    const SizeArgs s = makeSizeArgs(rt, op, plan, bytes, st.rank);
    OpCounts c;
    op.counts(s, &c);
    op.init(s, c, st.hostSend.get());
    if (plan.check) {
      if (op.expectedFromHostBackend) {
        rt.barrier->wait();
        if (st.t == 0) expectedOnHostBackend(rt, op, plan, bytes);
        rt.barrier->wait();
      } else {
        op.expected(s, c, st.hostSend.get(), st.hostExpected.get());
      }
    }
    const CompareFn compare = op.compare ? op.compare : compareBitwise;
    SlotResult result;
    result.checked = plan.check ? 1 : 0;
    double enqueueSum[kVariants] = {0, 0, 0, 0};
    auto timed = [&](int variant, int round, RunFn fn, const RunArgs& a) {
      double enqueue = 0;
      result.seconds[variant][round] = timeRun(rt, st, fn, a, &enqueue);
      enqueueSum[variant] += enqueue;
      result.enqueue[variant] = enqueueSum[variant] / (round + 1);
    };

    // Out of place. Its output after the timed calls is the output of one call: the input is untouched.
    upload(rt, st, st.send, st.hostSend.get(), c.sendBytes);
    poison(rt, st, st.recv, c.recvBytes);
    const RunArgs oop = makeRunArgs(rt, st, s, c, st.send, st.recv, false);
    timed(kOop, 0, op.run, oop);
    if (plan.check && op.reset) {  // state carried across the timed calls: check one fresh call instead
      poison(rt, st, st.recv, c.recvBytes);
      fullBarrier(rt, st.t);
      if (!op.reset(oop) || !op.run(oop)) die();
      if (!rt.host) H_CUDA(cudaStreamSynchronize(st.stream));
    }
    if (plan.check) {
      download(rt, st, st.hostRecv.get(), st.recv, c.recvBytes);
      result.wrong[0] = compare(s, c, st.hostRecv.get(), st.hostExpected.get());
    }

    // In place: the timed calls keep rewriting their own input, so the check uses one fresh call.
    if (plan.inPlace) {
      char* base = static_cast<char*>(st.recv);
      const RunArgs ip = makeRunArgs(rt, st, s, c, base + c.ipSendOffset, base + c.ipRecvOffset, true);
      poison(rt, st, base, inPlaceBytes(c));
      upload(rt, st, base + c.ipSendOffset, st.hostSend.get(), c.sendBytes);
      timed(kIp, 0, op.run, ip);
      if (plan.check) {
        poison(rt, st, base, inPlaceBytes(c));
        upload(rt, st, base + c.ipSendOffset, st.hostSend.get(), c.sendBytes);
        fullBarrier(rt, st.t);
        if (op.reset && !op.reset(ip)) die();
        if (!op.run(ip)) die();
        if (!rt.host) H_CUDA(cudaStreamSynchronize(st.stream));
        download(rt, st, st.hostRecv.get(), base + c.ipRecvOffset, c.recvBytes);
        result.wrong[1] = compare(s, c, st.hostRecv.get(), st.hostExpected.get());
      }
    }

    // The baselines, out of place on the same input (untouched: the in-place variant ran in the receive buffer),
    // then the further rounds (-r): zpccl's out-of-place calls and each baseline's again, in turn, so that all see
    // the same drift of the link. Each round's time is kept; the table gives their median. zpccl's output was
    // checked after the first round.
    RunArgs b = makeRunArgs(rt, st, s, c, st.send, st.recv, false);
    RunArgs bMatched = b;
    bMatched.nccl = st.ncclMatched;
    const bool matched = hasMatched(rt, plan, op);
    for (int round = 0; round < plan.rounds; ++round) {
      if (round > 0) timed(kOop, round, op.run, oop);
      if (plan.baseline) timed(kBaseline, round, op.baseline, b);
      if (matched) timed(kMatched, round, op.baseline, bMatched);
    }

    rt.slots[size_t(st.t)] = result;
    rt.barrier->wait();
    if (st.t == 0) reportSize(rt, opIndex, s, c);
    rt.barrier->wait();
  }

  if (st.t == 0) printOpFooter(rt, opIndex);
  rt.barrier->wait();
  freeBuffer(rt, st.send);
  freeBuffer(rt, st.recv);
  freeBuffer(rt, st.scratch);
  st.send = st.recv = st.scratch = nullptr;
}

// ---- rank threads ------------------------------------------------------------------------------------------

void printRankLines(Runtime& rt, RankState& st) {
  char line[kLineBytes];
  const int node = rt.nodeOf[size_t(st.rank)];
  char host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  if (rt.host) {
    std::snprintf(line, sizeof(line), "#  rank %3d  proc %2d  pid %7d  host %.40s  node %d  (host backend %s)", st.rank,
                  rt.group->rank(), int(getpid()), host, node, rt.hostOverMpi ? "over MPI" : "thread");
  } else {
    cudaDeviceProp prop;
    H_CUDA(cudaGetDeviceProperties(&prop, st.device));
    char bus[32] = "?";
    H_CUDA(cudaDeviceGetPCIBusId(bus, sizeof(bus), st.device));
    std::snprintf(line, sizeof(line),
                  "#  rank %3d  proc %2d  pid %7d  host %.40s  node %d (%.40s)  device %2d [%.16s] %.64s", st.rank,
                  rt.group->rank(), int(getpid()), host, node, rt.nodeName[size_t(node)].c_str(), st.device, bus,
                  prop.name);
  }
  rt.slotLine[size_t(st.t)] = line;
  rt.barrier->wait();
  if (st.t == 0) {
    struct Line {
      char text[kLineBytes];
    };
    std::vector<Line> local(static_cast<size_t>(rt.localRanks));
    for (int i = 0; i < rt.localRanks; ++i) {
      std::memset(local[size_t(i)].text, 0, kLineBytes);
      std::strncpy(local[size_t(i)].text, rt.slotLine[size_t(i)].c_str(), kLineBytes - 1);
    }
    const std::vector<Line> all = gatherLocal(rt, local);
    if (rt.group->rank() == 0)
      for (const Line& l : all)
        if (l.text[0] != '\0') std::printf("%s\n", l.text);
  }
  rt.barrier->wait();
}

// The node layout of the measured zpccl communicator, which may differ from the launch's guess (NCCL_HOSTID,
// config): the host-backend reference must see the same one.
void adoptZpLayout(Runtime& rt, RankState& st) {
  int node = 0, nodes = 0;
  H_ZP(st.comm, zpCommNodeRank(st.comm, &node));
  H_ZP(st.comm, zpCommNodeCount(st.comm, &nodes));
  rt.slotInt[size_t(st.t)] = node;
  rt.barrier->wait();
  if (st.t == 0) {
    std::vector<int> local(rt.slotInt.begin(), rt.slotInt.begin() + rt.localRanks);
    local.resize(size_t(rt.maxLocalRanks), -1);
    const std::vector<int> all = gatherLocal(rt, local);
    std::vector<int> nodeOf;
    for (int v : all)
      if (v >= 0) nodeOf.push_back(v);
    if (int(nodeOf.size()) != rt.nranks) fatal("layout exchange returned a wrong rank count");
    if (nodeOf != rt.nodeOf) {
      std::vector<std::string> names(static_cast<size_t>(nodes));
      for (int r = 0; r < rt.nranks; ++r) names[size_t(nodeOf[size_t(r)])] = rt.nodeName[size_t(rt.nodeOf[size_t(r)])];
      rt.nodeName = names;
      rt.nodeOf = nodeOf;
    }
    rt.nodes = nodes;
  }
  rt.barrier->wait();
}

void rankMain(Runtime& rt, int t) {
  RankState st;
  st.t = t;
  st.rank = rt.rankBase + t;
  setReportRank(st.rank);
  rt.expected[size_t(t)] = &st.hostExpected;
  if (!rt.host) {
    st.device = rt.devices[size_t(t)];
    H_CUDA(cudaSetDevice(st.device));
    H_CUDA(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
    H_CUDA(cudaEventCreate(&st.start));
    H_CUDA(cudaEventCreate(&st.stop));
  }
  if (rt.needNccl) H_NCCL(nullptr, ncclCommInitRank(&st.nccl, rt.nranks, rt.ncclId, st.rank));
  if (rt.needZp) {
    zpConfig_t config = ZP_CONFIG_INITIALIZER;
    config.backend = rt.host ? zpBackendHost : zpBackendCuda;
    if (rt.host || rt.opt.nodes > 0) config.ranksPerNode = rt.nranks / rt.nodes;
    for (const OpPlan& plan : rt.plans)
      if (plan.bits > 0) {
        // The comm's defaults follow the flags; op files may still pass per-call options (the Ex calls).
        config.weightBits = plan.bits;
        config.gradBits = plan.bits;
        config.blockSize = plan.block;
      }
#ifdef ZP_PERF_MPI
    if (rt.hostOverMpi) {
      zpTransport_t transport;
      H_ZP(nullptr, zpMpiTransportCreate(MPI_COMM_WORLD, &transport));
      H_ZP(nullptr, zpCommInitFromTransport(&st.comm, &transport, &config));
    }
#endif
    if (!rt.hostOverMpi) H_ZP(nullptr, zpCommInitRankConfig(&st.comm, rt.nranks, rt.zpId, st.rank, &config));
    adoptZpLayout(rt, st);
    if (!rt.host) H_ZP(st.comm, zpCommReserve(st.comm, rt.opt.maxBytes));
  }
  // NCCL as zpccl's communicators get it, for the fair baseline: the same facts (zpccl's node layout, the
  // environment) give every rank the same answer, so all of them split or none.
  if (rt.ncclBaseline && st.nccl != nullptr) {
    const NcclChannels channels = zpNcclChannels(rt.nodes, rt.nranks);
    if (channels.any()) H_NCCL(st.nccl, splitWithChannels(st.nccl, st.rank, channels, &st.ncclMatched));
    rt.barrier->wait();
    if (st.t == 0) rt.ncclChannels = channels;
    rt.barrier->wait();
  }
  printRankLines(rt, st);

  for (size_t i = 0; i < rt.ops.size(); ++i) runOp(rt, st, i);

  if (st.comm != nullptr) H_ZP(st.comm, zpCommDestroy(st.comm));
  if (st.ncclMatched != nullptr) H_NCCL(st.ncclMatched, ncclCommDestroy(st.ncclMatched));
  if (st.nccl != nullptr) H_NCCL(st.nccl, ncclCommDestroy(st.nccl));
  if (!rt.host) {
    H_CUDA(cudaEventDestroy(st.start));
    H_CUDA(cudaEventDestroy(st.stop));
    H_CUDA(cudaStreamDestroy(st.stream));
  }
  rt.expected[size_t(t)] = nullptr;
}

// ---- the run: options, rank layout, the sweep --------------------------------------------------------------

struct Ids {
  ncclUniqueId nccl;
  zpUniqueId zp;
  int ok;
};

// Resolves the flags against one op; false (with a message) when they do not fit it.
bool planOp(const Options& opt, bool host, const PerfOp& op, OpPlan* plan, std::string* error) {
  plan->type = static_cast<zpDataType_t>(opt.type >= 0 ? opt.type : op.defaultType);
  if (!isSupportedType(plan->type)) {
    *error = std::string(op.name) + ": data type " + typeName(plan->type) + " is not supported by the harness";
    return false;
  }
  if (op.quantTypesOnly && !isQuantType(plan->type)) {
    *error = std::string(op.name) + " takes half, bfloat16 or float, not " + typeName(plan->type);
    return false;
  }
  plan->redOp = static_cast<zpRedOp_t>(op.reduces && opt.redOp >= 0 ? opt.redOp : zpSum);
  plan->bits = op.defaultBits > 0 ? (opt.bits > 0 ? opt.bits : op.defaultBits) : 0;
  plan->block = op.defaultBits > 0 ? opt.blockSize : 0;
  plan->inPlace = op.hasInPlace && opt.inPlace != 0;
  if (host && op.gpuOnly) {
    *error = std::string(op.name) + " runs device kernels only: there is no host backend to run with -H";
    return false;
  }
  if (host && (op.uses & kUsesNccl)) {
    *error = std::string(op.name) + " runs NCCL and needs the cuda backend (drop -H 1)";
    return false;
  }
  plan->baseline = op.baseline != nullptr && !(host && (op.baselineUses & kUsesNccl));
  // A comparison takes several alternating rounds, so that its median and spread say how far it holds.
  plan->rounds = opt.rounds > 0 ? opt.rounds : plan->baseline ? kDefaultComparedRounds : 1;
  plan->wire = host && op.wire != nullptr;
  plan->check = opt.check != 0 && (op.expected != nullptr || op.expectedFromHostBackend);
  return true;
}

// Options: the flags, the ops this run measures (on the host backend, those that have one) and each one's plan,
// the communicators they need, the sizes. False when the run ends here, with its exit status in *status (help,
// bad flags).
bool setUpOptions(Runtime& rt, const std::vector<PerfOp>& ops, int argc, char** argv, bool underMpi, int* status) {
  std::string error;
  const char* program = rt.program.c_str();
  switch (parseOptions(argc, argv, &rt.opt, &error)) {
    case ParseResult::kHelp:
      printUsage(stdout, program);
      *status = 0;
      return false;
    case ParseResult::kError:
      std::fprintf(stderr, "%s: %s\n", program, error.c_str());
      printUsage(stderr, program);
      *status = 2;
      return false;
    case ParseResult::kOk:
      break;
  }
  const Options& opt = rt.opt;
  if (underMpi && opt.nprocs > 1) {
    std::fprintf(stderr, "%s: -P/-I/-D are for runs without mpirun; under mpirun the ranks come from MPI\n", program);
    *status = 2;
    return false;
  }
  rt.host = opt.host != 0;
  for (const PerfOp& op : ops) {
    if (rt.host && op.gpuOnly) {
      rt.leftOut.push_back(op.name);
    } else {
      rt.ops.push_back(op);
    }
  }
  if (rt.ops.empty()) {  // every op runs device kernels only: planOp refuses -H
    rt.ops = ops;
    rt.leftOut.clear();
  }
  for (const PerfOp& op : rt.ops) {
    OpPlan plan;
    if (!planOp(opt, rt.host, op, &plan, &error)) {
      std::fprintf(stderr, "%s: %s\n", program, error.c_str());
      *status = 2;
      return false;
    }
    rt.plans.push_back(plan);
    if (!rt.host && ((op.uses | (plan.baseline ? op.baselineUses : 0u)) & kUsesNccl)) rt.needNccl = true;
    if (plan.baseline && (op.baselineUses & kUsesNccl)) rt.ncclBaseline = true;
    if ((op.uses | (plan.baseline ? op.baselineUses : 0u)) & kUsesZp) rt.needZp = true;
  }
  rt.sizes = sizeSweep(opt);
  rt.stats.resize(rt.ops.size());
  return true;
}

// What this process says of itself before the ranks are laid out.
ProcInfo describeProcess(const Runtime& rt) {
  ProcInfo mine;
  std::memset(&mine, 0, sizeof(mine));
  gethostname(mine.hostname, sizeof(mine.hostname) - 1);
  std::snprintf(mine.nodeKey, sizeof(mine.nodeKey), "%s", hostKey().c_str());  // the library's node, NCCL's host
  mine.deviceCount = 0;
  if (!rt.host) {
    cudaError_t err = cudaGetDeviceCount(&mine.deviceCount);
    if (err != cudaSuccess || mine.deviceCount == 0) {
      bool hostRuns = false;  // whether -H would run some of these ops
      for (const PerfOp& op : rt.ops) hostRuns = hostRuns || !op.gpuOnly;
      std::fprintf(stderr, "%s: process %d: no usable CUDA device (%s)%s\n", rt.program.c_str(), rt.group->rank(),
                   err != cudaSuccess ? cudaGetErrorString(err) : "none visible",
                   hostRuns ? "; -H 1 runs the host backend" : "");
      mine.deviceCount = -1;
    }
  }
  mine.threads = rt.opt.threads;
  if (mine.threads == 0)
    for (const PerfOp& op : rt.ops)
      if (op.defaultThreads > 0) {
        mine.threads = op.defaultThreads;
        break;
      }
  return mine;
}

// Rank layout: every process's description, exchanged, then where each rank runs and which node it is on
// (perf/rank_layout.h). False with the exit status in *status when the run cannot start.
bool setUpRanks(Runtime& rt, int* status) {
  const int nprocs = rt.group->size(), me = rt.group->rank();
  ProcInfo mine = describeProcess(rt);
  // The host backend across processes: its ranks meet over MPI (libzpccl_mpi's transport), one rank a process;
  // processes that meet otherwise (-P) have no transport between their ranks.
  if (rt.host && nprocs > 1) {
    if (std::strcmp(rt.group->kind(), "mpi") != 0) {
      std::fprintf(stderr,
                   "%s: -H with several processes runs under mpirun (a build with MPI): the host backend's "
                   "ranks meet over MPI\n",
                   rt.program.c_str());
      *status = 2;
      return false;
    }
    if (rt.opt.threads > 1) {
      std::fprintf(stderr, "%s: under mpirun the host backend runs one rank a process (-t 1)\n", rt.program.c_str());
      *status = 2;
      return false;
    }
    rt.hostOverMpi = true;
    mine.threads = 1;
  }
  std::vector<ProcInfo> info(static_cast<size_t>(nprocs));
  std::string error;
  if (!rt.group->allGather(&mine, sizeof(mine), info.data(), &error)) {
    std::fprintf(stderr, "%s: exchange between processes: %s\n", rt.program.c_str(), error.c_str());
    *status = 1;
    return false;
  }
  for (const ProcInfo& p : info)
    if (p.deviceCount < 0) {  // every process stops, the one without a device has said why
      *status = 1;
      return false;
    }
  if (!layOutRanks(info, me, rt.host, rt.opt.shareGpus != 0, rt.opt.nodes, &rt, &error)) {
    if (me == 0) std::fprintf(stderr, "%s: %s\n", rt.program.c_str(), error.c_str());
    *status = 2;
    return false;
  }
  return true;
}

// The communicators' unique ids, from process 0; and the host-backend reference's meeting key.
bool shareIds(Runtime& rt) {
  const char* program = rt.program.c_str();
  Ids ids;
  std::memset(&ids, 0, sizeof(ids));
  if (rt.group->rank() == 0) {
    ids.ok = 1;
    if (rt.needNccl) {
      ncclResult_t res = ncclGetUniqueId(&ids.nccl);
      if (res != ncclSuccess) {
        std::fprintf(stderr, "%s: ncclGetUniqueId failed: %s\n", program, ncclGetErrorString(res));
        ids.ok = 0;
      }
    }
    if (rt.needZp && ids.ok) {
      zpResult_t res = zpGetUniqueId(&ids.zp);
      if (res != zpSuccess) {
        std::fprintf(stderr, "%s: zpGetUniqueId failed: %s: %s\n", program, zpGetErrorString(res),
                     zpGetLastError(nullptr));
        ids.ok = 0;
      }
    }
  }
  std::string error;
  if (!rt.group->broadcast(&ids, sizeof(ids), 0, &error)) {
    std::fprintf(stderr, "%s: exchange between processes: %s\n", program, error.c_str());
    return false;
  }
  if (!ids.ok) return false;
  rt.ncclId = ids.nccl;
  rt.zpId = ids.zp;
  for (size_t i = 0; i < rt.ops.size(); ++i)
    if (rt.plans[i].check && rt.ops[i].expectedFromHostBackend) {
      zpResult_t res = zpGetUniqueId(&rt.hostRefId);
      if (res != zpSuccess) {
        std::fprintf(stderr, "%s: zpGetUniqueId failed: %s: %s\n", program, zpGetErrorString(res),
                     zpGetLastError(nullptr));
        return false;
      }
      break;
    }
  return true;
}

void printEnvironment() {
  static const char* vars[] = {"NCCL_HOSTID", "NCCL_P2P_DISABLE",     "NCCL_SHM_DISABLE", "NCCL_NVLS_ENABLE",
                               "NCCL_NET",    "NCCL_SOCKET_IFNAME",   "NCCL_IB_DISABLE",  "NCCL_ALGO",
                               "NCCL_PROTO",  "CUDA_VISIBLE_DEVICES", "ZP_BACKEND"};
  std::string line;
  for (const char* v : vars) {
    const char* value = std::getenv(v);
    if (value != nullptr) line += std::string("  ") + v + "=" + value;
  }
  if (!line.empty()) std::printf("#  env (process 0):%s\n", line.c_str());
}

// The run's header: process 0 describes it, the others say who they are.
void printHeader(Runtime& rt, int argc, char** argv) {
  const Options& opt = rt.opt;
  const char* program = rt.program.c_str();
  const int nprocs = rt.group->size(), me = rt.group->rank();
  if (me != 0) {
    std::printf("# zpccl perf: %s: process %d of %d (%s rendezvous); process 0 prints the results\n", program, me,
                nprocs, rt.group->kind());
    return;
  }
  rt.provenance = collectProvenance(argc, argv, opt.regime);
  std::printf("# zpccl perf: %s\n", program);
  std::printf("#  backend %s  regime %s  ranks %d  nodes %d  processes %d (%s)\n", rt.host ? "host" : "cuda",
              opt.regime.empty() ? "-" : opt.regime.c_str(), rt.nranks, rt.nodes, nprocs, rt.group->kind());
  std::printf("#  sizes %s .. %s (%zu)  iters %d  warmup %d  rounds %s  check %d  in-place %d\n",
              formatBytes(opt.minBytes).c_str(), formatBytes(opt.maxBytes).c_str(), rt.sizes.size(), opt.iters,
              opt.warmup,
              opt.rounds > 0 ? std::to_string(opt.rounds).c_str()
                             : (std::to_string(kDefaultComparedRounds) + " against a baseline, else 1").c_str(),
              opt.check, opt.inPlace);
  std::printf("#  source %s%s\n", rt.provenance.commit.empty() ? "unknown" : rt.provenance.commit.c_str(),
              rt.provenance.dirty == 1 ? " (dirty: tracked files differed from it when this binary was built)" : "");
  for (const std::string& name : rt.leftOut)
    std::printf("#  %s runs device kernels only: not run on the host backend\n", name.c_str());
  printEnvironment();
}

// The sweep: one thread per local rank, every op over every size (rankMain).
void runSweep(Runtime& rt) {
  // Host-side data and references use the cores left to each rank thread.
  setHostThreads(std::max(1, int(std::thread::hardware_concurrency()) / rt.localRanks));
  rt.barrier = std::make_unique<ThreadBarrier>(rt.localRanks);
  rt.slots.resize(size_t(rt.localRanks));
  rt.slotInt.resize(size_t(rt.localRanks));
  rt.slotLine.resize(size_t(rt.localRanks));
  rt.expected.resize(size_t(rt.localRanks));
  std::vector<std::thread> workers;
  for (int t = 0; t < rt.localRanks; ++t) workers.emplace_back(rankMain, std::ref(rt), t);
  for (auto& w : workers) w.join();
}

}  // namespace

int perfMain(const std::vector<PerfOp>& ops, int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* slash = std::strrchr(argv[0], '/');
  Runtime rt;
  rt.program = slash ? slash + 1 : argv[0];

  std::unique_ptr<ProcGroup> group;
  std::string error;
  if (launchedByMpi()) {
    group = makeMpiProcGroup(&argc, &argv, &error);
    if (!group) {
      std::fprintf(stderr, "%s: %s\n", rt.program.c_str(), error.c_str());
      return 1;
    }
    gGroup = group.get();
  }
  int status = 0;
  if (!setUpOptions(rt, ops, argc, argv, group != nullptr, &status)) return status;
  if (!group) {
    if (rt.opt.nprocs > 1) {
      group =
          makeFileProcGroup(rt.opt.rendezvousDir, rt.opt.nprocs, rt.opt.procIndex, rendezvousTimeoutSeconds(), &error);
      if (!group) {
        std::fprintf(stderr, "%s: rendezvous: %s\n", rt.program.c_str(), error.c_str());
        return 1;
      }
    } else {
      group = makeSingleProcGroup();
    }
  }
  gGroup = group.get();
  rt.group = group.get();
  if (!setUpRanks(rt, &status)) return status;
  if (!shareIds(rt)) return 1;
  printHeader(rt, argc, argv);
  runSweep(rt);

  if (rt.group->rank() == 0) std::printf("# %s\n", rt.anyWrong ? "FAILED: wrong elements (see #wrong)" : "done");
  gGroup = nullptr;
  return rt.anyWrong ? 1 : 0;
}

}  // namespace perf
}  // namespace zp
