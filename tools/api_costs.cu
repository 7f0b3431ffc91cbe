// zpccl-api-costs: the host's time per CUDA runtime call that a zpccl collective makes as it enqueues, on one
// GPU from one thread, then on every visible GPU from a thread each at once (as the perf binaries drive their
// ranks: the driver's locks are the process's). A small call's time is the sum of these (perf rows'
// enqueue_us), so this says which of them to spend fewer of. Run on the GPU machine: build-gpu/tools/zpccl-api-costs
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Args64 {
  unsigned long long word[8];
};
struct Args256 {
  unsigned long long word[32];
};
__global__ void empty64(Args64 a) {
  if (a.word[0] == 1 && threadIdx.x == 1024) a.word[1] = 0;
}
__global__ void empty256(Args256 a) {
  if (a.word[0] == 1 && threadIdx.x == 1024) a.word[1] = 0;
}

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

struct Probe {
  std::string name;
  std::function<void()> call;
};

struct Cost {
  std::string name;
  double us;
};

// Microseconds per call of each probe on `device`, `iters` calls each (the stream drained between probes).
std::vector<Cost> measure(int device, int iters) {
  CHECK(cudaSetDevice(device));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CHECK(cudaEventRecord(ev, s));
  void* buf = nullptr;
  CHECK(cudaMalloc(&buf, 1 << 20));
  Args64 a64{};
  Args256 a256{};
  std::vector<Probe> probes = {
      {"launch (64 B args)", [&] { empty64<<<64, 256, 0, s>>>(a64); }},
      {"launch (256 B args)", [&] { empty256<<<64, 256, 0, s>>>(a256); }},
      {"cudaEventRecord", [&] { CHECK(cudaEventRecord(ev, s)); }},
      {"cudaStreamWaitEvent", [&] { CHECK(cudaStreamWaitEvent(s, ev, 0)); }},
      {"cudaStreamIsCapturing",
       [&] {
         cudaStreamCaptureStatus st;
         CHECK(cudaStreamIsCapturing(s, &st));
       }},
      {"cudaPointerGetAttributes",
       [&] {
         cudaPointerAttributes at;
         CHECK(cudaPointerGetAttributes(&at, buf));
       }},
      {"cudaGetDevice",
       [&] {
         int d;
         CHECK(cudaGetDevice(&d));
       }},
      {"cudaDeviceGetAttribute",
       [&] {
         int v;
         CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device));
       }},
      {"cudaGetLastError", [&] { (void)cudaGetLastError(); }},
  };
  std::vector<Cost> costs;
  for (const Probe& p : probes) {
    for (int i = 0; i < 100; ++i) p.call();
    CHECK(cudaStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) p.call();
    costs.push_back(
        {p.name, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters});
    CHECK(cudaStreamSynchronize(s));
  }
  CHECK(cudaFree(buf));
  CHECK(cudaEventDestroy(ev));
  CHECK(cudaStreamDestroy(s));
  return costs;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("zpccl-api-costs: no CUDA device\n");
    return 0;
  }
  const int iters = 2000;
  const std::vector<Cost> alone = measure(0, iters);
  std::vector<std::vector<Cost>> together(static_cast<size_t>(devices));
  std::vector<std::thread> threads;
  for (int d = 0; d < devices; ++d) threads.emplace_back([&, d] { together[size_t(d)] = measure(d, iters); });
  for (auto& t : threads) t.join();
  std::printf("%-26s %12s %22s\n", "host us per call", "one thread", "a thread per GPU (max)");
  for (size_t i = 0; i < alone.size(); ++i) {
    double worst = 0;
    for (const auto& v : together) worst = v[i].us > worst ? v[i].us : worst;
    std::printf("%-26s %12.2f %22.2f\n", alone[i].name.c_str(), alone[i].us, worst);
  }
  return 0;
}
