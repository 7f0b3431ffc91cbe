// Direct loads among the ranks of one NVLink domain.
//
// When NCCL maps every rank's memory into every other rank's address space (its load/store-accessible "LSA"
// team: the ranks of one node whose GPUs reach each other over NVLink), a rank can read a peer's payload with
// plain loads from inside its own dequantize or reduce kernel. Each payload byte then crosses NVLink once,
// straight into the kernel that consumes it: there is no NCCL transfer to overlap with our kernels, no chunk
// pipeline, and our kernels keep every SM. Over NVLink that beats the chunk pipeline on NCCL's transfers
// (perf/RESULTS.md, qwZ and qgZ, nvlink).
//
// The window is a buffer of the communicator, allocated by ncclMemAlloc and registered on its world
// communicator as a symmetric window (collective: every rank grows it in the same call, since every rank makes
// the same calls with the same counts). NCCL maps the ranks' windows at one stride in this process, so the n
// payloads of a call are one strided batch for the existing kernels.
//
// Ordering across ranks needs no NCCL call: the two kernels of a call wait for and raise flags in the windows
// (device/peer_sync.h). A call runs, on the caller's stream,
//   the write: waits until every peer has read this rank's window of the previous call, quantizes into it, and
//     raises "written" in every peer's window;
//   the read: waits until every peer has raised "written" for this call, reads every rank's window, and raises
//     "read done" in every peer's window.
// The flags hold call counts, kept in device memory, so graphs replay the protocol too. The first bytes of each
// window hold the flags (PeerSync::flagBytes), the payload follows. Flags, not NCCL all-reduces of one word
// (barriers): a barrier costs more than a small call's whole transfer.
//
// Aborting the communicator unmaps the peers' windows, maybe while a call's kernels wait for a peer that will
// never come, or are still queued: they would then fault, and a fault ends the whole CUDA context. So the kernels
// check a cancel word as they start and while they wait, which the abort sets first (cancelPeerReads).
//
// Used when every rank of the world is in NCCL's LSA team, zpccl's topology has one node, NCCL's P2P transport
// is not disabled (NCCL_P2P_DISABLE: the user asked that GPUs not reach each other directly, and the perf
// harness's shm regime relies on it), and the call moves at least ZP_DIRECT_MIN_BYTES logical bytes (by default
// every call; the plan of the call decides, host/coll_plan.h). The ranks agree at init on whether direct loads are
// usable (an all-reduce of it), so they never take different paths.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "device/kernel_stream.h"
#include "include/zpccl.h"

namespace zp {

// The communicator's device words of the direct path (PeerWindow::words), followed in the same allocation by room
// for the ranks' window addresses (windowRankAddresses).
struct PeerWindowWords {
  int barrier;               // what peerBarrier all-reduces: always 0
  int vote;                  // what the ranks agree on (agreeOnWord): at init, whether every rank can use direct
                             // loads; before a growth, whether any rank's graph holds the window
  int cancel;                // nonzero once the kernels are cancelled (cancelPeerReads)
  unsigned int arrived;      // PeerSync::arrived
  unsigned long long calls;  // PeerSync::calls
};

struct PeerWindow {
  bool usable = false;               // decided once at init, the same on every rank
  void* local = nullptr;             // this rank's window (ncclMemAlloc), what its kernels write
  size_t bytes = 0;                  // its size; only grows, never inside graph capture, never once frozen
  bool captured = false;             // a call captured in a CUDA graph on this rank uses it (its payload, flags)
  bool frozen = false;               // never grows again: some rank's graph holds it (growPeerWindow; every rank)
  bool broken = false;               // a growth failed part of the way: the ranks may disagree on the window, so
                                     // every later call on the direct path fails (prepareWindow)
  ncclWindow_t handle = nullptr;     // its registration on the world communicator
  uintptr_t rank0 = 0;               // rank 0's window as mapped in this process
  size_t rankStride = 0;             // bytes from rank r's window to rank r + 1's, as mapped here
  PeerWindowWords* words = nullptr;  // device memory, then scratch for the ranks' window addresses
  cudaEvent_t readStart = nullptr;   // the last call's kernels (outside graph capture) may start,
  cudaEvent_t readDone = nullptr;    // and are done
  int nranks = 0;
  int rank = 0;

  // Device word: nonzero once the kernels are cancelled (cancelPeerReads).
  int* cancelWord() const { return words != nullptr ? &words->cancel : nullptr; }
  // Bytes at the start of a window before its payload: the flags.
  size_t payloadOffset() const { return PeerSync::flagBytes(nranks); }
  // This rank's payload, where its write kernel quantizes.
  char* payload() const { return static_cast<char*>(local) + payloadOffset(); }
  // Rank r's payload, as this process reads it.
  const char* rankWindow(int r) const {
    return reinterpret_cast<const char*>(rank0 + r * rankStride + payloadOffset());
  }
  // How a call's write (write = true) or read kernel takes part in the flag protocol.
  PeerSync sync(bool write) const;
};

// What decides whether a rank can use direct loads.
struct DirectLoadsFacts {
  int64_t minBytes;    // ZP_DIRECT_MIN_BYTES (< 0: never)
  int nranks;          // ranks of the communicator
  int nodes;           // nodes in zpccl's topology
  const char* p2pOff;  // NCCL_P2P_DISABLE, or nullptr when unset
  int lsaRanks;        // ranks in this rank's NCCL load/store-accessible team (0: NCCL's device API not built)
  int ncclBuilt;       // NCCL_VERSION_CODE of the nccl.h built against (major * 10000 + minor * 100 + patch)
  int ncclRun;         // ncclGetVersion of the NCCL library this process runs with
};

// Why a rank with these facts cannot use direct loads, or nullptr when it can.
const char* directLoadsBlocker(const DirectLoadsFacts& f);

// Decides whether the communicator can use direct loads, with the other ranks (collective over world).
zpResult_t initPeerWindow(ncclComm_t world, int nranks, int rank, int nodes, cudaStream_t setupStream, PeerWindow* w);

// Grows the window to at least `bytes`: collective over world, and a host rendezvous. The caller has made sure
// that no work of this rank still uses the old window (src/cuda/pipeline.h, prepareWindow); an all-reduce makes
// sure of the other ranks' before it is deregistered. That all-reduce is also a vote: when a call captured in a
// CUDA graph on any rank uses the old window, a replay would read and write it after the growth freed it, so
// every rank instead freezes the window at its size (w.frozen) and the calls it cannot hold take NCCL's path.
// `stop` ends its host waits (src/cuda/host_wait.h).
zpResult_t growPeerWindow(PeerWindow& w, ncclComm_t world, size_t bytes, cudaStream_t setupStream,
                          const std::atomic<bool>* stop, const char* call);

// Every rank's `stream` has reached this point: an NCCL all-reduce of one word. Used when the window grows.
zpResult_t peerBarrier(const PeerWindow& w, ncclComm_t world, cudaStream_t stream, const char* call);

// Before NCCL unmaps the peers' windows (ncclCommAbort, or ncclCommRevoke on a failed communicator): sets the
// cancel word, so that the kernels still queued or waiting on the caller's streams do nothing (PeerSync::cancel),
// and waits for a call's kernels already running. A read that a replayed CUDA graph runs at that moment is not waited
// for (its events cannot be recorded in the capture). Idempotent.
void cancelPeerReads(PeerWindow* w);

// Deregisters the window from world (collective, like ncclCommDestroy), before world is destroyed. Skipped after
// an abort: a collective deregistration could wait for a dead peer, and NCCL drops the registration with the
// communicator.
void deregisterPeerWindow(PeerWindow* w, ncclComm_t world);

// Frees the window's memory, once the communicators are gone and the device is idle (freeing memory waits for
// the device, which must not happen while another communicator's kernel still waits for a peer). After an abort
// the last call's write and read may still be queued: the memory is freed once they have passed, and kept (a
// warning says so) when the caller's stream is still blocked after a few seconds.
void freePeerWindow(PeerWindow* w);

}  // namespace zp
