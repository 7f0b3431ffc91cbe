// The cross-rank flag protocol of direct-load calls (src/cuda/peer_window.h): what a kernel waits for and raises
// in the ranks' windows, and the device steps that do it (peerEnter, peerLeave).
#pragma once

#include <cstddef>

namespace zp {

/**
 * @brief How the kernels of a direct-load call (src/cuda/peer_window.h) order themselves with the other ranks' kernels,
 *        without any NCCL call: through flags in the ranks' windows, which NCCL maps into this process over
 *        NVLink. A call is four kernels on each rank:
 *          a wait (launchPeerWait, one thread): until every peer has finished reading this rank's window in the
 *            previous call (their kReadDone flags have reached this rank's count of calls);
 *          the write (quantize into this rank's window), whose last CTA counts the call and raises this rank's
 *            kWritten flag in every peer's window;
 *          a wait: until every peer's kWritten flag has reached the count;
 *          the read (from every rank's window), whose last CTA raises this rank's kReadDone flag in every peer's
 *            window.
 *        The waits are kernels of one thread, not a step of the big kernels: a big kernel waiting with every SM
 *        could keep off this GPU the kernel of another communicator that a peer waits for (a deadlock). Small
 *        calls, whose time is mostly the host's launches, fold the waits into their kernels (waitInKernel), on a
 *        grid of at most a quarter of the device's resident CTAs, which leaves the other slots to any other
 *        kernel.
 *        The count lives in device memory, so that CUDA graphs replay the protocol too, and the two flags and the
 *        one-buffer window need no barrier between calls. `cancel` (device memory, or nullptr): a kernel whose
 *        CTA finds it nonzero as it starts does nothing, and a wait stops; zpccl sets it before NCCL unmaps the
 *        peers' windows (an abort), so no queued kernel touches them afterwards.
 *        Zero-initialized: no flags, no cancel word.
 */
struct PeerSync {
  enum Flag : int { kNone = -1, kWritten = 0, kReadDone = 1 };

  char* rank0 = nullptr;                ///< rank 0's window as mapped here; null: no flags (cancel only)
  size_t rankStride = 0;                ///< bytes from rank r's window to rank r + 1's
  unsigned long long* calls = nullptr;  ///< this rank's count of direct calls written (device)
  unsigned int* arrived = nullptr;      ///< CTAs of the running kernel that have finished (device; the last resets it)
  const int* cancel = nullptr;          ///< nonzero: kernels do nothing (see above)
  int nranks = 0;
  int rank = 0;
  int waitFor = kNone;        ///< the peers' flag that launchPeerWait waits for: at least this rank's count
  int raise = kNone;          ///< the flag the kernel's last CTA raises in every peer's window, to this rank's count
  bool waitInKernel = false;  ///< the kernel's CTAs wait for `waitFor` themselves, instead of launchPeerWait

  /// The write (the kernel that raises kWritten) first adds one to the count.
  constexpr bool countsCall() const { return raise == kWritten; }

  /// Rank r's flag `flag` as a peer sees it in window `owner` (flags are the first bytes of a window).
  static constexpr size_t flagOffset(int flag, int writer, int nranks) {
    return (static_cast<size_t>(flag) * nranks + writer) * sizeof(unsigned long long);
  }
  /// Bytes at the start of each window that hold the flags (the payload follows).
  static constexpr size_t flagBytes(int nranks) { return (flagOffset(kReadDone + 1, 0, nranks) + 255) / 256 * 256; }
};

#ifdef __CUDACC__
__device__ __forceinline__ unsigned long long loadAcquireSystem(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void storeReleaseSystem(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ bool cancelled(const int* cancel) {
  return cancel != nullptr && *static_cast<const volatile int*>(cancel) != 0;
}

/// Until every peer's flag `s.waitFor` in this rank's window has reached this rank's count of calls; false when
/// the cancel word stops the wait. One thread waits.
__device__ __forceinline__ bool waitForPeers(const PeerSync& s) {
  const unsigned long long target = *static_cast<volatile unsigned long long*>(s.calls);
  const char* mine = s.rank0 + static_cast<size_t>(s.rank) * s.rankStride;
  for (int p = 0; p < s.nranks; ++p) {
    if (p == s.rank) continue;
    const auto* flag = reinterpret_cast<const unsigned long long*>(mine + PeerSync::flagOffset(s.waitFor, p, s.nranks));
    while (loadAcquireSystem(flag) < target) {
      if (cancelled(s.cancel)) return false;
      __nanosleep(32);
    }
  }
  return true;
}

/// A kernel's first step (every thread of every CTA): false when the CTA must do nothing, because the cancel
/// word is set (PeerSync::cancel) or was set while the CTA waited for the peers (s.waitInKernel). One thread
/// reads and waits; the CTA meets at a barrier, so that it stops or goes on whole (its kernels have block-wide
/// barriers). CTAs that start before the word is set run to the end; a cancelled call's output is undefined.
__device__ __forceinline__ bool peerEnter(const PeerSync& s) {
  if (s.cancel == nullptr) return true;  // the same for every thread: the argument of the launch
  bool stop = false;
  if (threadIdx.x == 0) {
    stop = cancelled(s.cancel) || (s.waitInKernel && s.waitFor != PeerSync::kNone && !waitForPeers(s));
  }
  return __syncthreads_or(stop) == 0;
}

/// A kernel's last step (every thread of every CTA that entered): the last CTA to finish counts the call
/// (s.countsCall()) and raises s.raise in every peer's window. Each CTA's writes and reads are ordered before its
/// arrival by a barrier and a system-scope fence (fences are cumulative), the flags after every arrival.
__device__ __forceinline__ void peerLeave(const PeerSync& s) {
  if (s.raise == PeerSync::kNone) return;  // the same for every thread: the argument of the launch
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence_system();
  if (atomicAdd(s.arrived, 1u) != gridDim.x * gridDim.y * gridDim.z - 1) return;
  *static_cast<volatile unsigned int*>(s.arrived) = 0;
  unsigned long long count = *static_cast<volatile unsigned long long*>(s.calls);
  if (s.countsCall()) *static_cast<volatile unsigned long long*>(s.calls) = ++count;
  __threadfence_system();
  for (int p = 0; p < s.nranks; ++p) {
    if (p == s.rank) continue;
    char* theirs = s.rank0 + static_cast<size_t>(p) * s.rankStride;
    storeReleaseSystem(reinterpret_cast<unsigned long long*>(theirs + PeerSync::flagOffset(s.raise, s.rank, s.nranks)),
                       count);
  }
}
#endif

}  // namespace zp
