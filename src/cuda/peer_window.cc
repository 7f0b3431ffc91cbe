#include "src/cuda/peer_window.h"

#include <atomic>
#include <cstdlib>
#include <vector>

#include "device/peer_window.h"
#include "host/base/check.h"
#include "host/base/debug.h"
#include "host/base/params.h"
#include "host/quant_format.h"
#include "src/cuda/host_wait.h"
#include "src/cuda/nccl_check.h"

#if ZP_HAVE_NCCL_DEVICE
#if __has_include(<nccl_device/host.h>)
#include <nccl_device/host.h>  // ncclTeamLsa, where the device API has a host half of its own
#else
#include <nccl_device/core.h>  // ncclTeamLsa
#endif
#endif

namespace zp {

namespace {

// ncclCheck for the window's NCCL calls: their results are used on the host at once (the vote read back, the
// memory and its registration), so ncclInProgress is an error here; the message says how to do without direct
// loads.
zpResult_t ncclCheckWindow(ncclResult_t r, const char* call, const char* what) {
  return ncclCheck(r, call, what, NcclInProgress::kMustComplete, "; ZP_DIRECT_MIN_BYTES=-1 turns direct loads off");
}

// The ranks' `mine` combined by `op` (ncclMin, ncclMax) into *all, through the vote word: collective over world,
// and a host wait.
zpResult_t agreeOnWord(const PeerWindow& w, ncclComm_t world, int mine, ncclRedOp_t op, cudaStream_t stream,
                       const std::atomic<bool>* stop, const char* call, const char* what, int* all) {
  int* vote = &w.words->vote;
  CUDACHECK(cudaMemcpyAsync(vote, &mine, sizeof(int), cudaMemcpyHostToDevice, stream));
  ZPCHECK(ncclCheckWindow(ncclAllReduce(vote, vote, 1, ncclInt32, op, world, stream), call, what));
  CUDACHECK(cudaMemcpyAsync(all, vote, sizeof(int), cudaMemcpyDeviceToHost, stream));
  return waitOnHost(stream, stop, call, what);
}

// nccl_device.h is inline code that reads NCCL's own structs: those of another major.minor may differ.
constexpr char kNcclVersionMismatch[] = "the NCCL library run is another major.minor than the nccl.h built with";

// The version of the NCCL library this process runs with, as far as the direct loads care: the built one when
// they are not built (no device code of NCCL's to disagree with) or when NCCL cannot say.
int runningNcclVersion() {
  int version = 0;
#if ZP_HAVE_NCCL_DEVICE
  if (ncclGetVersion(&version) == ncclSuccess) return version;
#endif
  (void)version;
  return NCCL_VERSION_CODE;
}

// The facts of this rank (directLoadsBlocker's input). NCCL's team is asked last, and only when nothing else
// rules direct loads out: asking sets up NCCL's symmetric memory for the communicator.
DirectLoadsFacts factsOf(ncclComm_t world, int nranks, int nodes) {
  DirectLoadsFacts f{paramDirectMinBytes(), nranks, nodes, std::getenv("NCCL_P2P_DISABLE"), nranks, NCCL_VERSION_CODE,
                     runningNcclVersion()};
  const char* why = directLoadsBlocker(f);
  if (why != nullptr) {
    static std::atomic<bool> warned{false};  // once a process: every communicator has the same reason
    if (why == kNcclVersionMismatch && !warned.exchange(true)) {
      ZP_WARN(
          "direct loads off: built with NCCL %d.%d.%d's device API (nccl_device.h), running NCCL %d.%d.%d; "
          "collectives take NCCL's path (build zpccl against the NCCL it runs with)",
          f.ncclBuilt / 10000, f.ncclBuilt / 100 % 100, f.ncclBuilt % 100, f.ncclRun / 10000, f.ncclRun / 100 % 100,
          f.ncclRun % 100);
    }
    return f;
  }
#if ZP_HAVE_NCCL_DEVICE
  f.lsaRanks = ncclTeamLsa(world).nRanks;
#else
  (void)world;
  f.lsaRanks = 0;
#endif
  return f;
}

}  // namespace

const char* directLoadsBlocker(const DirectLoadsFacts& f) {
  if (f.minBytes < 0) return "ZP_DIRECT_MIN_BYTES < 0";
  if (f.nranks < 2) return "one rank";
  if (f.nodes != 1) return "ranks on several nodes";
  if (ncclSwitchOn(f.p2pOff)) return "NCCL_P2P_DISABLE is set";
  if (f.ncclBuilt / 100 != f.ncclRun / 100) return kNcclVersionMismatch;
  if (f.lsaRanks == 0) return "built without NCCL's device API (nccl_device.h)";
  if (f.lsaRanks != f.nranks) return "not every rank is in NCCL's load/store-accessible team";
  return nullptr;
}

zpResult_t initPeerWindow(ncclComm_t world, int nranks, int rank, int nodes, cudaStream_t setupStream, PeerWindow* w) {
  *w = PeerWindow();
  w->nranks = nranks;
  w->rank = rank;
  if (nranks < 2) return zpSuccess;  // the same on every rank: nothing to agree on
  const char* why = directLoadsBlocker(factsOf(world, nranks, nodes));
  // The device words, then room for the ranks' window addresses.
  const size_t wordsBytes = sizeof(PeerWindowWords) + nranks * sizeof(uintptr_t);
  CUDACHECK(cudaMalloc(&w->words, wordsBytes));
  CUDACHECK(cudaMemsetAsync(w->words, 0, wordsBytes, setupStream));
  // Every rank must choose the same path: the minimum of the ranks' answers (1 = can).
  int all = 0;
  ZPCHECK(agreeOnWord(*w, world, why == nullptr ? 1 : 0, ncclMin, setupStream, nullptr, "zpCommInitRank",
                      "ncclAllReduce of the direct-loads vote", &all));
  w->usable = all == 1;
  if (w->usable) {
    CUDACHECK(cudaEventCreateWithFlags(&w->readStart, cudaEventDisableTiming));
    CUDACHECK(cudaEventCreateWithFlags(&w->readDone, cudaEventDisableTiming));
  }
  ZP_INFO(kSubsysInit, "direct loads among the %d ranks: %s%s", nranks, w->usable ? "yes" : "no, ",
          w->usable ? "" : (why != nullptr ? why : "another rank cannot"));
  return zpSuccess;
}

PeerSync PeerWindow::sync(bool write) const {
  PeerSync s;
  s.rank0 = reinterpret_cast<char*>(rank0);
  s.rankStride = rankStride;
  s.calls = &words->calls;
  s.arrived = &words->arrived;
  s.cancel = cancelWord();
  s.nranks = nranks;
  s.rank = rank;
  s.waitFor = write ? PeerSync::kReadDone : PeerSync::kWritten;
  s.raise = write ? PeerSync::kWritten : PeerSync::kReadDone;
  return s;
}

zpResult_t peerBarrier(const PeerWindow& w, ncclComm_t world, cudaStream_t stream, const char* call) {
  // A maximum of zeros stays zero: the word never changes, whatever the number of calls.
  return ncclCheckWindow(ncclAllReduce(&w.words->barrier, &w.words->barrier, 1, ncclInt32, ncclMax, world, stream),
                         call, "ncclAllReduce (barrier of the direct loads)");
}

zpResult_t growPeerWindow(PeerWindow& w, ncclComm_t world, size_t bytes, cudaStream_t setupStream,
                          const std::atomic<bool>* stop, const char* call) {
#if ZP_HAVE_NCCL_DEVICE
  // A step that fails leaves the window broken: the other ranks may have grown theirs, so no rank can tell which
  // path the next call takes. Its size is set last, once every rank's window is known and mapped.
  w.broken = true;
  // No rank may still read the old window: this one's work is done (the caller waited), the others' once every
  // rank has voted. Nor may a graph replay later: if any rank captured it, no rank frees it.
  if (w.handle != nullptr) {
    int anyCaptured = 0;
    ZPCHECK(agreeOnWord(w, world, w.captured ? 1 : 0, ncclMax, setupStream, stop, call,
                        "ncclAllReduce of the window's captured vote", &anyCaptured));
    if (anyCaptured != 0) {
      w.frozen = true;
      w.broken = false;
      ZP_INFO(kSubsysAlloc,
              "%s : direct-load window frozen at %zu bytes, not grown to %zu: a CUDA graph holds it; calls it cannot "
              "hold take NCCL's path (zpCommReserve before the first capture sizes it)",
              call, w.bytes, bytes);
      return zpSuccess;
    }
    ZPCHECK(ncclCheckWindow(ncclCommWindowDeregister(world, w.handle), call, "ncclCommWindowDeregister"));
    ZPCHECK(ncclCheckWindow(ncclMemFree(w.local), call, "ncclMemFree"));
    w.handle = nullptr;
    w.local = nullptr;
    w.bytes = 0;
  }
  const size_t rounded = alignUp(bytes, size_t{2} << 20);
  ZPCHECK(ncclCheckWindow(ncclMemAlloc(&w.local, rounded), call, "ncclMemAlloc"));
  // Zeroed once, so that no byte of it is ever undefined (compute-sanitizer initcheck); its flags start at 0 on
  // every rank, and so does the count of calls they are compared with (the arrival counter is 0 between kernels).
  CUDACHECK(cudaMemsetAsync(w.local, 0, rounded, setupStream));
  CUDACHECK(cudaMemsetAsync(&w.words->arrived, 0, sizeof(w.words->arrived), setupStream));
  CUDACHECK(cudaMemsetAsync(&w.words->calls, 0, sizeof(w.words->calls), setupStream));
  ZPCHECK(waitOnHost(setupStream, stop, call, "zeroing the direct-load window"));
  ZPCHECK(ncclCheckWindow(ncclCommWindowRegister(world, w.local, rounded, &w.handle, NCCL_WIN_COLL_SYMMETRIC), call,
                          "ncclCommWindowRegister"));
  std::vector<uintptr_t> at;
  ZPCHECK(windowRankAddresses(w.handle, w.nranks, w.words + 1, setupStream, &at));
  w.rank0 = at[0];
  w.rankStride = at[1] - at[0];
  for (int r = 0; r < w.nranks; ++r) {
    if (at[r] != w.rank0 + r * w.rankStride || w.rankStride % kPayloadAlign != 0) {
      return ZP_ERR(zpInternalError, "%s : NCCL mapped the ranks' windows at uneven strides (rank %d at %#zx)", call, r,
                    static_cast<size_t>(at[r]));
    }
  }
  // Also connects the barrier's all-reduce outside capture.
  ZPCHECK(peerBarrier(w, world, setupStream, call));
  ZPCHECK(waitOnHost(setupStream, stop, call, "the peers' barrier after the window grew"));
  w.bytes = rounded;
  w.broken = false;
  ZP_INFO(kSubsysAlloc, "%s : direct-load window grown to %zu bytes (ranks %zu bytes apart)", call, rounded,
          w.rankStride);
  return zpSuccess;
#else
  (void)w, (void)world, (void)bytes, (void)setupStream, (void)stop;
  return ZP_ERR(zpInternalError, "%s : direct loads without NCCL's device API", call);
#endif
}

namespace {

// Waits at most `seconds` for `query` (cudaEventQuery or cudaStreamQuery of something) to stop answering
// cudaErrorNotReady. False when it still does, or on an error. Never blocks in the driver: the abort path must
// not hang on a stream that never drains.
template <class Query>
bool waitAtMost(double seconds, Query query) {
  return pollUntilDone(query, nullptr, seconds) == WaitEnd::kDone;
}

constexpr double kDrainSeconds = 5.0;

}  // namespace

void cancelPeerReads(PeerWindow* w) {
  if (!w->usable || w->cancelWord() == nullptr) return;
  // On a stream of its own: the caller's streams may be blocked, and the legacy default stream waits for them.
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
    if (cudaMemsetAsync(w->cancelWord(), 1, sizeof(int), s) != cudaSuccess ||
        !waitAtMost(kDrainSeconds, [&] { return cudaStreamQuery(s); })) {
      ZP_WARN("direct loads: could not set the cancel word; a queued read may fault once the windows are unmapped");
    }
    (void)cudaStreamDestroy(s);
  }
  // A call whose kernels started before the word was set may be running now: let it end (a kernel that waits for a
  // peer sees the word and stops).
  if (cudaEventQuery(w->readStart) == cudaSuccess &&
      !waitAtMost(kDrainSeconds, [&] { return cudaEventQuery(w->readDone); })) {
    ZP_WARN("direct loads: a read still runs %.0f s after the abort began", kDrainSeconds);
  }
}

void deregisterPeerWindow(PeerWindow* w, ncclComm_t world) {
#if ZP_HAVE_NCCL_DEVICE
  if (w->handle != nullptr) (void)ncclCommWindowDeregister(world, w->handle);
#else
  (void)world;
#endif
  w->handle = nullptr;
}

void freePeerWindow(PeerWindow* w) {
  if (w->readDone != nullptr && !waitAtMost(kDrainSeconds, [&] { return cudaEventQuery(w->readDone); })) {
    ZP_WARN("direct loads: the last call is still queued after the abort; its window (%zu bytes) is not freed",
            w->bytes);
    *w = PeerWindow();
    return;
  }
  for (cudaEvent_t ev : {w->readStart, w->readDone}) {
    if (ev != nullptr) (void)cudaEventDestroy(ev);
  }
#if ZP_HAVE_NCCL_DEVICE
  if (w->local != nullptr) (void)ncclMemFree(w->local);
#endif
  if (w->words != nullptr) (void)cudaFree(w->words);
  *w = PeerWindow();
}

}  // namespace zp
