// Throwaway probe (not built by meson): can runtime kernels, events and graph capture use green-context streams?
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cstdio>

#define RT(x) do { cudaError_t e_ = (x); printf("%-60s %s\n", #x, cudaGetErrorString(e_)); } while (0)
#define DRV(x) do { CUresult r_ = (x); const char* s_ = nullptr; cuGetErrorString_p(r_, &s_); printf("%-60s %d %s\n", #x, (int)r_, s_ ? s_ : "?"); } while (0)

__global__ void fill(int* p, int v, int n) { for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v; }
__global__ void spin(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }

PFN_cuGetErrorString_v6000 cuGetErrorString_p;
template <class F> F get(const char* n, int v) { void* p = nullptr; cudaDriverEntryPointQueryResult q; cudaGetDriverEntryPointByVersion(n, &p, v, cudaEnableDefault, &q); printf("lookup %s: %p (%d)\n", n, p, (int)q); return (F)p; }

int main() {
  cudaSetDevice(0); cudaFree(0);
  cuGetErrorString_p = get<PFN_cuGetErrorString_v6000>("cuGetErrorString", 6000);
  auto getRes = get<PFN_cuDeviceGetDevResource_v12040>("cuDeviceGetDevResource", 12040);
  auto split = get<PFN_cuDevSmResourceSplitByCount_v12040>("cuDevSmResourceSplitByCount", 12040);
  auto gen = get<PFN_cuDevResourceGenerateDesc_v12040>("cuDevResourceGenerateDesc", 12040);
  auto create = get<PFN_cuGreenCtxCreate_v12040>("cuGreenCtxCreate", 12040);
  auto screate = get<PFN_cuGreenCtxStreamCreate_v12050>("cuGreenCtxStreamCreate", 12050);
  CUdevResource all{}, grp{}, rest{};
  DRV(getRes(0, &all, CU_DEV_RESOURCE_TYPE_SM));
  printf("sms %u minPartition %u align %u\n", all.sm.smCount, all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment);
  for (unsigned want : {100u, 99u, 96u, 64u}) {
    unsigned nb = 1; CUdevResource g{}, r{};
    CUresult res = split(&g, &nb, &all, &r, 0, want);
    printf("split want %u -> res %d groups %u smCount %u rest %u\n", want, (int)res, nb, g.sm.smCount, r.sm.smCount);
  }
  unsigned nb = 1;
  DRV(split(&grp, &nb, &all, &rest, 0, 96));
  CUdevResourceDesc desc; DRV(gen(&desc, &grp, 1));
  CUgreenCtx g; DRV(create(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  CUstream gs; DRV(screate(&gs, g, CU_STREAM_NON_BLOCKING, 0));
  cudaStream_t ps; cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking);
  int* buf; cudaMalloc(&buf, 1 << 20);
  int n = 1 << 18;
  fill<<<1024, 256, 0, gs>>>(buf, 7, n); RT(cudaGetLastError());
  RT(cudaStreamSynchronize(gs));
  int h = 0; cudaMemcpy(&h, buf + n - 1, 4, cudaMemcpyDeviceToHost); printf("kernel on green stream wrote %d (want 7)\n", h);
  cudaEvent_t e1, e2; cudaEventCreate(&e1); cudaEventCreate(&e2);
  RT(cudaEventRecord(e1, ps));
  RT(cudaEventRecord(e2, gs));       // primary-context event on a green stream
  RT(cudaStreamWaitEvent(ps, e2, 0));
  RT(cudaStreamWaitEvent(gs, e1, 0));
  RT(cudaEventSynchronize(e2));
  float ms = -1; RT(cudaEventElapsedTime(&ms, e1, e2)); printf("elapsed %.3f ms\n", ms);
  // SM occupancy check: a spin grid of 132*8 CTAs on the green stream; count distinct SMs? measure time instead:
  // graph capture across primary and green streams
  cudaStream_t cs; cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
  cudaEvent_t f1, f2; cudaEventCreateWithFlags(&f1, cudaEventDisableTiming); cudaEventCreateWithFlags(&f2, cudaEventDisableTiming);
  RT(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  RT(cudaEventRecord(f1, cs));
  RT(cudaStreamWaitEvent(gs, f1, 0));
  fill<<<64, 256, 0, gs>>>(buf, 9, n); RT(cudaGetLastError());
  RT(cudaEventRecord(f2, gs));
  RT(cudaStreamWaitEvent(cs, f2, 0));
  cudaGraph_t graph = nullptr; RT(cudaStreamEndCapture(cs, &graph));
  cudaGraphExec_t ge = nullptr;
  if (graph) { RT(cudaGraphInstantiate(&ge, graph, 0)); }
  if (ge) { RT(cudaGraphLaunch(ge, cs)); RT(cudaStreamSynchronize(cs)); cudaMemcpy(&h, buf + n - 1, 4, cudaMemcpyDeviceToHost); printf("graph wrote %d (want 9)\n", h); }
  // Does a green grid leave SMs free? spin kernel 2 CTAs/SM-worth on green, then a 36-CTA spin on primary: overlap?
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a, ps);
  spin<<<96 * 8, 256, 0, gs>>>(50000000);   // ~25 ms at 2 GHz
  spin<<<32, 1024, 0, ps>>>(50000000);
  cudaEventRecord(b, ps); cudaStreamWaitEvent(ps, e2, 0);
  cudaDeviceSynchronize(); ms = 0; cudaEventElapsedTime(&ms, a, b); printf("primary spin finished %.2f ms after start (about 25 if it ran beside the green grid, 50 if after)\n", ms);
  RT(cudaGetLastError());
  return 0;
}
