#include "src/cuda/pipeline_trace.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "host/base/debug.h"
#include "host/base/params.h"

namespace zp {

PipelineTrace::PipelineTrace(CudaExec& e, const char* op, size_t logicalBytes, int chunks, cudaStream_t caller)
    : e_(e), op_(op), bytes_(logicalBytes), chunks_(chunks), caller_(caller) {
  if (paramTracePipeline() == 0 || chunks > kMaxPipelineChunks) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(caller, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone) return;
  while (e.traceEvents.size() < kEvents) {
    cudaEvent_t ev = nullptr;
    if (cudaEventCreate(&ev) != cudaSuccess) return;
    e.traceEvents.push_back(ev);
  }
  on_ = cudaEventRecord(e.traceEvents[0], caller) == cudaSuccess;
}

void PipelineTrace::report() {
  if (!on_) return;
  cudaEvent_t done = e_.traceEvents[1];
  float ms = 0;
  if (cudaEventRecord(done, caller_) != cudaSuccess || cudaEventSynchronize(done) != cudaSuccess ||
      cudaEventElapsedTime(&ms, e_.traceEvents[0], done) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  const double total = 1000.0 * ms;
  double busy[kStages] = {0, 0, 0, 0};
  std::string chunks;
  for (int c = 0; c < chunks_; ++c) {
    chunks += " | c" + std::to_string(c);
    for (int s = 0; s < kStages; ++s) {
      const double begin = at(slot(static_cast<Stage>(s), c, false)), end = at(slot(static_cast<Stage>(s), c, true));
      if (begin < 0 || end < 0) continue;
      busy[s] += end - begin;
      char text[64];
      snprintf(text, sizeof(text), " %c %.0f-%.0f", "qmfo"[s], begin, end);
      chunks += text;
    }
  }
  const double sum = busy[0] + busy[1] + busy[2];
  const double longest = std::max(busy[0], std::max(busy[1], busy[2]));
  const double overlap = sum > longest ? (sum - total) / (sum - longest) : 0.0;
  ZP_INFO(kSubsysColl,
          "trace %s %zu B, %d chunk(s): %.1f us; busy quantize %.1f, move %.1f, finish %.1f, own slot %.1f us;"
          " overlap %.2f; per chunk (q quantize, m move, f finish, o own slot; us from the call's start)%s",
          op_, bytes_, chunks_, total, busy[0], busy[1], busy[2], busy[3], overlap, chunks.c_str());
}

double PipelineTrace::at(size_t i) const {
  if (!marked_.test(i)) return -1;
  float ms = 0;
  if (cudaEventElapsedTime(&ms, e_.traceEvents[0], e_.traceEvents[i]) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return 1000.0 * ms;
}

}  // namespace zp
