"""perf/step_trace.py: where a traced step's device time goes, from a Chrome trace."""
from __future__ import annotations

import unittest

from . import load_script


def event(name: str, cat: str, ts: float, dur: float) -> dict[str, object]:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}


class StepTrace(unittest.TestCase):
    def setUp(self) -> None:
        self.st = load_script("perf/step_trace.py")

    def test_kernel_classes(self) -> None:
        c = self.st.kernel_class
        self.assertEqual(c("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"), "nccl")
        self.assertEqual(c("ncclKernel_ReduceScatter_RING_SIMPLE_Sum_bf16"), "nccl")
        self.assertEqual(c("void zp::(anonymous namespace)::quantizeWarpKernel(zp::QuantArgs)"), "zpccl")
        self.assertEqual(c("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), "compute")
        self.assertEqual(c("void at::native::vectorized_elementwise_kernel<4, ...>"), "compute")
        self.assertEqual(c("Memcpy DtoD (Device -> Device)", "gpu_memcpy"), "memory")
        self.assertEqual(c("Memset (Device)", "gpu_memset"), "memory")

    def test_unions_and_overlaps(self) -> None:
        st = self.st
        self.assertEqual(st.merge([(5, 8), (0, 2), (1, 3), (8, 9)]), [(0, 3), (5, 9)])
        self.assertEqual(st.length(st.merge([(0, 2), (1, 3)])), 3)
        self.assertEqual(st.overlap([(0, 3), (5, 9)], [(2, 6), (8, 20)]), 1 + 1 + 1)
        self.assertEqual(st.overlap([(0, 1)], [(2, 3)]), 0)
        self.assertEqual(st.overlap([], [(0, 1)]), 0)

    def test_summary_of_a_trace(self) -> None:
        # Two steps. Compute 0-10 ms and 40-50; NCCL 5-15 (half hidden by compute); zpccl 20-25 and 45-47 (the second
        # hidden); a copy 30-31; host annotations. Times in microseconds, as Chrome traces keep them.
        k = 1000.0
        trace = {"traceEvents": [
            event("gemm", "kernel", 0, 10 * k), event("gemm", "kernel", 40 * k, 10 * k),
            event("ncclDevKernel_AllGather", "kernel", 5 * k, 10 * k),
            event("void zp::x::quantizeWarpKernel(zp::QuantArgs)", "kernel", 20 * k, 5 * k),
            event("void zp::x::dequantizeKernel(zp::DequantArgs)", "kernel", 45 * k, 2 * k),
            event("Memcpy DtoD", "gpu_memcpy", 30 * k, 1 * k),
            event("FSDP::all_gather", "user_annotation", 0, 3 * k),
            event("FSDP::all_gather", "user_annotation", 40 * k, 3 * k),
            event("FSDP::post_backward_reduce", "user_annotation", 10 * k, 1 * k),
            event("aten::mm", "cpu_op", 0, 99 * k),  # an op, not an annotation: not counted
            {"ph": "i", "name": "marker", "cat": "kernel", "ts": 0},  # not a complete event
        ]}
        s = self.st.summarize(trace, 2)
        self.assertEqual(s["steps"], 2)
        self.assertEqual(s["device_events"], 6)
        self.assertEqual(s["kernel_ms"], {"compute": 10.0, "nccl": 5.0, "zpccl": 3.5, "memory": 0.5})
        self.assertEqual(s["kernels"], {"compute": 1.0, "nccl": 0.5, "zpccl": 1.0, "memory": 0.5})
        self.assertEqual(s["busy_ms"], (15 + 5 + 1 + 10) / 2)  # 0-15, 20-25, 30-31, 40-50
        self.assertEqual(s["compute_busy_ms"], 10.0)
        self.assertEqual(s["comm_exposed_ms"], (5 + 5) / 2)  # NCCL 10-15, zpccl 20-25
        self.assertEqual(s["annotations_ms"], {"FSDP::all_gather": 3.0, "FSDP::post_backward_reduce": 0.5})
        self.assertEqual(list(s["annotations_ms"]), ["FSDP::all_gather", "FSDP::post_backward_reduce"])  # longest first

    def test_the_table_names_every_configuration_and_rank(self) -> None:
        one = self.st.summarize({"traceEvents": [event("gemm", "kernel", 0, 2000.0)]}, 1)
        lines = self.st.table({"nccl": [one, one], "zpccl-hpz": [one, one]})
        self.assertEqual(len(lines), 5)
        self.assertTrue(lines[1].split()[1:4] == ["nccl", "0", "2.0"], lines[1])
        self.assertTrue(lines[4].split()[1:3] == ["zpccl-hpz", "1"], lines[4])


if __name__ == "__main__":
    unittest.main()
