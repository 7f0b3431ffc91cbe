// How big a device/ kernel's grid is: the CTAs of a kernel that fit on one SM (residentCtas), and the grids
// built from them (gridFor). Grids are sized to the SMs a stream may fill (KernelStream::sms), and the kernels
// loop grid-stride over whatever work is beyond them, so any grid is correct: these are sizing choices only.
// For the launchers of .cu files (it names kernels as template arguments).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>

#include "device/kernel_stream.h"
#include "host/base/check.h"
#include "include/zpccl.h"

namespace zp {

/// ceil(log2(v)): the shift of a power of two.
inline int log2Int(size_t v) {
  int s = 0;
  while ((size_t{1} << s) < v) ++s;
  return s;
}

#ifdef __CUDACC__
/// CTAs of `threads` threads of Kernel (with `smem` bytes of dynamic shared memory) that fit on one SM, cached per
/// kernel and CTA size. A sizing hint only: any grid is correct.
template <auto Kernel>
zpResult_t residentCtas(int threads, size_t smem, int* perSm) {
  static std::atomic<int> cache[32];
  const int slot = log2Int(threads);
  int n = cache[slot].load(std::memory_order_relaxed);
  if (n == 0) {
    CUDACHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, threads, smem));
    if (n < 1) n = 1;
    cache[slot].store(n, std::memory_order_relaxed);
  }
  *perSm = n;
  return zpSuccess;
}

/// A grid of `batch` segments (y) of at most `ctasPerSegment` CTAs (x): one wave of resident CTAs on the stream's
/// SMs, split over the segments (grid-stride loops do the rest: an extra partial wave would idle most SMs at the
/// end); never more CTAs than a segment has work for.
template <auto Kernel>
zpResult_t gridFor(size_t ctasPerSegment, int batch, int threads, size_t smem, const KernelStream& stream, dim3* grid) {
  int sms = 0, perSm = 0;
  CUDACHECK(kernelStreamSms(stream, &sms));
  ZPCHECK(residentCtas<Kernel>(threads, smem, &perSm));
  const int gy = batch < 65535 ? batch : 65535;
  const size_t resident = static_cast<size_t>(sms) * perSm;
  size_t gx = resident / gy;
  if (gx > ctasPerSegment) gx = ctasPerSegment;
  if (gx < 1) gx = 1;
  *grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
  return zpSuccess;
}

/// A one-dimensional grid for `work` tiles of `threads`-thread CTAs: at most `waves` waves of resident CTAs on
/// the stream's SMs, a grid-stride loop for the rest.
template <auto Kernel>
zpResult_t gridFor(size_t work, int threads, int waves, const KernelStream& stream, unsigned* grid) {
  int sms = 0, perSm = 0;
  ZPCHECK(residentCtas<Kernel>(threads, 0, &perSm));
  CUDACHECK(kernelStreamSms(stream, &sms));
  const size_t cap = static_cast<size_t>(sms) * perSm * waves;
  *grid = static_cast<unsigned>(work < cap ? work : cap);
  return zpSuccess;
}
#endif

}  // namespace zp
