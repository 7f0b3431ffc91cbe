// The tracing diagnostic of the cuda backend's pipelines (pipeline.h).
#pragma once

#include <cuda_runtime.h>

#include <bitset>
#include <cstddef>

#include "host/base/check.h"
#include "host/chunk_plan.h"
#include "src/cuda/cuda_exec.h"
#include "src/cuda/pipeline.h"

namespace zp {

// ZP_TRACE_PIPELINE=1: timing events around each stage of each chunk, read back at the end of the call and logged
// (INFO COLL) as one line: when each stage of each chunk ran, relative to the call's start (and the own slot's
// kernel, CollPlan::ownSlot, wherever it runs), each stage's busy time, and the overlap achieved: (sum of the stages'
// busy times - the call's time) / (that sum - the busiest stage's), 0 when the stages ran one after another, 1 for a
// perfect pipeline. The read-back is a host wait, so a traced call is never captured (inside capture the trace is off)
// and back-to-back traced calls do not overlap.
class PipelineTrace {
 public:
  enum Stage { kQuantize = 0, kMove = 1, kFinish = 2, kOwn = 3 };  // kOwn: not a stage of the overlap

  PipelineTrace(CudaExec& e, const char* op, size_t logicalBytes, int chunks, cudaStream_t caller);

  // Stage s of chunk c begins (end = false) or ends (true) at this point of `stream`.
  void mark(Stage s, int c, bool end, cudaStream_t stream) {
    if (!on_) return;
    if (cudaEventRecord(e_.traceEvents[slot(s, c, end)], stream) != cudaSuccess) on_ = false;
    marked_.set(slot(s, c, end));
  }

  // After the call is joined back to the caller's stream: waits for it and logs the line.
  void report();

 private:
  static constexpr int kStages = 4;
  static constexpr size_t kEvents = 2 + 2 * kStages * kMaxPipelineChunks;
  static size_t slot(Stage s, int c, bool end) {
    return 2 + 2 * kStages * static_cast<size_t>(c) + 2 * s + (end ? 1 : 0);
  }
  // Microseconds from the call's start to event i, or -1 when that event was not recorded in this call.
  double at(size_t i) const;

  CudaExec& e_;
  const char* op_;
  size_t bytes_;
  int chunks_;
  cudaStream_t caller_;
  bool on_ = false;
  std::bitset<kEvents> marked_;  // the events recorded in this call (the others may hold an earlier call's time)
};

// Ends a traced call: joins its stages back into the caller's stream (endPipeline), then reports the trace.
inline zpResult_t endPipeline(CudaExec& e, const Stages& s, PipelineTrace& trace) {
  ZPCHECK(endPipeline(e, s));
  trace.report();
  return zpSuccess;
}

}  // namespace zp
