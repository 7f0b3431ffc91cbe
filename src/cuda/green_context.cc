#include "src/cuda/green_context.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "host/base/check.h"
#include "host/base/debug.h"

namespace zp {

namespace {

// The driver calls, looked up at run time (zpccl links only the runtime; a driver older than the green-context
// API simply has none).
struct GreenApi {
  PFN_cuDeviceGetDevResource_v12040 getDevResource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 splitByCount = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 generateDesc = nullptr;
  PFN_cuGreenCtxCreate_v12040 create = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 streamCreate = nullptr;
  bool complete = false;
};

template <class Fn>
bool lookup(const char* symbol, unsigned version, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

const GreenApi& greenApi() {
  static const GreenApi api = [] {
    GreenApi a;
    a.complete = lookup("cuDeviceGetDevResource", 12040, &a.getDevResource) &&
                 lookup("cuDevSmResourceSplitByCount", 12040, &a.splitByCount) &&
                 lookup("cuDevResourceGenerateDesc", 12040, &a.generateDesc) &&
                 lookup("cuGreenCtxCreate", 12040, &a.create) &&
                 lookup("cuGreenCtxStreamCreate", 12050, &a.streamCreate);
    return a;
  }();
  return api;
}

// The largest SM group of `all` that leaves at least `leaveFree` SMs out. The split rounds a request up to the
// partition granularity, so smaller requests are tried until one fits.
bool splitOff(const GreenApi& api, const CUdevResource& all, int leaveFree, CUdevResource* group) {
  const int total = static_cast<int>(all.sm.smCount);
  const int step = std::max(1, static_cast<int>(all.sm.smCoscheduledAlignment));
  const int smallest = std::max(1, static_cast<int>(all.sm.minSmPartitionSize));
  for (int want = (total - leaveFree) / step * step; want >= smallest; want -= step) {
    unsigned groups = 1;
    CUdevResource input = all, remaining{};
    if (api.splitByCount(group, &groups, &input, &remaining, 0, static_cast<unsigned>(want)) == CUDA_SUCCESS &&
        groups == 1 && static_cast<int>(group->sm.smCount) + leaveFree <= total) {
      return true;
    }
  }
  return false;
}

// The device's green context: one for the whole process, made on first use and kept until exit, in which every
// communicator on the device makes its own streams: two communicators in flight on one device, each with a green
// context of its own, can hang (GpuConcurrency), so they share this one.
// Null when none can be made.
struct DeviceGreenContext {
  CUgreenCtx context = nullptr;
  int sms = 0;
};

DeviceGreenContext makeGreenContext(int device, int leaveFree) {
  DeviceGreenContext made;
  const GreenApi& api = greenApi();
  if (!api.complete) {
    ZP_INFO(kSubsysInit, "no green contexts in this driver: the pipelines' kernels share every SM with NCCL");
    return made;
  }
  CUdevResource all{}, group{};
  CUdevResourceDesc desc = nullptr;
  if (api.getDevResource(static_cast<CUdevice>(device), &all, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS ||
      !splitOff(api, all, leaveFree, &group) || api.generateDesc(&desc, &group, 1) != CUDA_SUCCESS ||
      api.create(&made.context, desc, static_cast<CUdevice>(device), CU_GREEN_CTX_DEFAULT_STREAM) != CUDA_SUCCESS) {
    ZP_INFO(kSubsysInit, "device %d: no green context leaving %d of %u SMs free: the pipelines' kernels share every SM",
            device, leaveFree, all.sm.smCount);
    made.context = nullptr;
    return made;
  }
  made.sms = static_cast<int>(group.sm.smCount);
  ZP_INFO(kSubsysInit, "device %d: the pipelines' kernels run on %d of %u SMs (ZP_NCCL_SMS=%d)", device, made.sms,
          all.sm.smCount, leaveFree);
  return made;
}

}  // namespace

zpResult_t createGreenStreams(int device, int leaveFree, int priority, GreenStreams* out) {
  *out = GreenStreams();
  if (leaveFree <= 0 || device < 0) return zpSuccess;
  static std::mutex mutex;
  static std::map<int, DeviceGreenContext> contexts;
  DeviceGreenContext ctx;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto made = contexts.find(device);  // present once tried, even when no context could be made
    if (made == contexts.end()) made = contexts.emplace(device, makeGreenContext(device, leaveFree)).first;
    ctx = made->second;
  }
  if (ctx.context == nullptr) return zpSuccess;
  GreenStreams g;
  g.sms = ctx.sms;
  for (cudaStream_t* s : {&g.quant, &g.side}) {
    CUstream stream = nullptr;
    if (greenApi().streamCreate(&stream, ctx.context, CU_STREAM_NON_BLOCKING, priority) != CUDA_SUCCESS) {
      destroyGreenStreams(&g);
      return ZP_ERR(zpUnhandledCudaError, "device %d: cuGreenCtxStreamCreate failed", device);
    }
    *s = stream;
  }
  *out = g;
  return zpSuccess;
}

void destroyGreenStreams(GreenStreams* g) {
  for (cudaStream_t s : {g->quant, g->side}) {
    if (s != nullptr) (void)cudaStreamDestroy(s);
  }
  *g = GreenStreams();  // the context is the device's, kept for the next communicator
}

}  // namespace zp
