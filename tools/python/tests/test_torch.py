"""torch tensors: CPU tensors on the host backend, and CUDA tensors on the cuda backend in spawned processes
(one per GPU, through torch.distributed). Skipped without torch, and the GPU tests without enough GPUs."""
from __future__ import annotations

import os
import unittest
from typing import Any

import numpy as np

import zpccl

from . import _reference as ref


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise unittest.SkipTest("torch is not installed") from None
    return torch


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def bf16_bits(t: Any) -> np.ndarray:
    """A bf16 tensor's bits as a NumPy uint16 array."""
    import torch

    return t.detach().cpu().view(torch.int16).numpy().view(np.uint16)


class CpuTensorsOnTheHostBackend(unittest.TestCase):
    def setUp(self) -> None:
        self.torch = import_torch()

    def test_launcher_node_id_reads_the_launchers_variables(self) -> None:
        """The node of a process from its launcher's variables: GROUP_RANK, else RANK // LOCAL_WORLD_SIZE, else
        None (no launcher said, or no rank to divide); a value that is not a count is refused by name."""
        from unittest import mock

        from zpccl import _torch as ztorch

        cases = [({}, None), ({"LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "3", "RANK": "1"}, 3),
                 ({"LOCAL_WORLD_SIZE": "4", "RANK": "9"}, 2), ({"LOCAL_WORLD_SIZE": "4"}, None),
                 ({"LOCAL_WORLD_SIZE": "", "RANK": "9"}, None)]
        for env, node in cases:
            with self.subTest(env=env), mock.patch.dict(os.environ, env, clear=True):
                self.assertEqual(ztorch.launcher_node_id(), node)
        for env, name in (({"LOCAL_WORLD_SIZE": "two", "RANK": "1"}, "LOCAL_WORLD_SIZE='two'"),
                          ({"LOCAL_WORLD_SIZE": "0", "RANK": "1"}, "LOCAL_WORLD_SIZE='0'"),
                          ({"LOCAL_WORLD_SIZE": "2", "RANK": "-1"}, "RANK='-1'")):
            with self.subTest(env=env), mock.patch.dict(os.environ, env, clear=True):
                with self.assertRaises(zpccl.ZpcclValueError) as caught:
                    ztorch.launcher_node_id()
                self.assertIn(f"from_torch_group: the environment's {name} is not an integer", str(caught.exception))

    def test_collectives_and_format(self) -> None:
        torch = self.torch
        shards = [torch.randn(300, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(r)) for r in range(4)]

        def body(rank: int, comm: zpccl.Comm) -> tuple:
            full = comm.quant_all_gather(shards[rank])
            offset, count = comm.hier_secondary_shard(full.numel())
            rebuilt = comm.hier_all_gather(full[offset:offset + count].clone())
            grads = torch.cat(shards)
            reduced = comm.quant_reduce_scatter(grads, op="avg")
            payload = comm.quantize(shards[rank], 8, 64)
            back = comm.dequantize(payload, 300, torch.bfloat16, 8, 64)
            return full, rebuilt, reduced, payload, back

        got = zpccl.run_host_ranks(4, body)
        bits = [bf16_bits(s) for s in shards]
        expected_full = np.concatenate([ref.round_trip(b, ref.BF16, 8, 256) for b in bits])
        expected_rs = ref.quant_reduce_scatter([np.concatenate(bits)] * 4, ref.BF16, "avg", 4, 256, [0] * 4)
        for rank, (full, rebuilt, reduced, payload, back) in enumerate(got):
            self.assertIsInstance(full, torch.Tensor)
            self.assertEqual((full.dtype, full.numel()), (torch.bfloat16, 1200))
            self.assertTrue(np.array_equal(bf16_bits(full), expected_full))
            self.assertTrue(torch.equal(rebuilt, full))
            self.assertTrue(np.array_equal(bf16_bits(reduced), expected_rs[rank]))
            self.assertEqual((payload.dtype, payload.numel()), (torch.uint8, ref.payload_size(300, 8, 64)))
            self.assertTrue(np.array_equal(payload.numpy(), ref.payload(bits[rank], ref.BF16, 8, 64)))
            self.assertTrue(np.array_equal(bf16_bits(back), ref.round_trip(bits[rank], ref.BF16, 8, 64)))

    def test_dtype_mapping(self) -> None:
        torch = self.torch
        r = zpccl.resolve_dtype
        self.assertEqual([r(t, "t") for t in (torch.bfloat16, torch.float16, torch.float32, torch.int8, torch.uint8,
                                               torch.int32, torch.int64, torch.float64)], [9, 6, 7, 0, 1, 2, 4, 8])

    def test_errors(self) -> None:
        torch = self.torch
        with zpccl.Comm(1, 0, zpccl.get_unique_id(), backend="host") as comm:
            with self.assertRaisesRegex(ValueError, r"quant_all_gather: send is not contiguous .*\.contiguous\(\)"):
                comm.quant_all_gather(torch.zeros(4, 4).t())
            with self.assertRaisesRegex(ValueError, "quant_all_gather: send dtype int64 is not supported"):
                comm.quant_all_gather(torch.zeros(4, dtype=torch.int64))
            with self.assertRaisesRegex(ValueError, "quant_all_gather: recv has 3 elements, expected 4"):
                comm.quant_all_gather(torch.zeros(4), torch.zeros(3))


# ---- GPU: workers run in spawned processes (import torch first, then zpccl) -----------------------------------


def _gpu_worker() -> None:
    """One rank (zpccl.launch's rendezvous in the environment): torch.distributed on NCCL, a zpccl communicator
    from the group, the three collectives checked against the NumPy model and against each other."""
    import torch
    import torch.distributed as dist

    import zpccl as zp
    from tests import _reference as model

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl")
    try:
        comm = zp.Comm.from_torch_group()
        assert (comm.nranks, comm.rank, comm.cuda_device, comm.backend) == (world, rank, rank, zp.Backend.CUDA)
        n = 4096 + 17

        def shard_of(r: int) -> Any:
            g = torch.Generator(device=dev).manual_seed(r)
            return torch.randn(n, dtype=torch.bfloat16, device=dev, generator=g)

        # qwZ: identical everywhere, equal to the host model and to quantize/dequantize on this GPU.
        full = comm.quant_all_gather(shard_of(rank))
        fulls = [torch.empty_like(full) for _ in range(world)]
        dist.all_gather(fulls, full)
        assert all(torch.equal(f, full) for f in fulls), "qwZ outputs differ between ranks"
        bits = [bf16_bits(shard_of(r)) for r in range(world)]
        expected = np.concatenate([model.round_trip(b, model.BF16, 8, 256) for b in bits])
        assert np.array_equal(bf16_bits(full), expected), "qwZ differs from the host model"
        own = comm.dequantize(comm.quantize(shard_of(rank), 8, 256), n, torch.bfloat16, 8, 256)
        assert torch.equal(own, full[rank * n:(rank + 1) * n])
        # On a side stream, with an explicit stream argument.
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            src = shard_of(rank)
            out = torch.empty(world * n, dtype=torch.bfloat16, device=dev)
        comm.quant_all_gather(src, out, stream=side)
        torch.cuda.current_stream(dev).wait_stream(side)
        assert torch.equal(out, full)

        # hpZ: the secondary shard rebuilds the forward gather exactly.
        offset, count = comm.hier_secondary_shard(full.numel())
        rebuilt = comm.hier_all_gather(full[offset:offset + count].clone())
        assert torch.equal(rebuilt, full), "hpZ did not rebuild the full tensor"

        # qgZ: equal to the host model, close to NCCL's reduce-scatter.
        grads = [torch.randn(world * n, dtype=torch.float32, device=dev,
                             generator=torch.Generator(device=dev).manual_seed(100 + r)) for r in range(world)]
        mine = grads[rank]
        reduced = comm.quant_reduce_scatter(mine, op="avg")
        exp = model.quant_reduce_scatter([g.cpu().numpy() for g in grads], model.F32, "avg", 4, 256, [0] * world)
        assert np.array_equal(reduced.cpu().numpy(), exp[rank]), "qgZ differs from the host model"
        nccl = torch.empty(n, dtype=torch.float32, device=dev)
        dist.reduce_scatter_tensor(nccl, mine, op=dist.ReduceOp.AVG)
        scale = max(float(g.abs().max()) for g in grads) / 7
        assert float((reduced - nccl).abs().max()) <= scale, "qgZ is far from NCCL's reduce-scatter"

        # Errors name the call and the device.
        for bad, msg in ((shard_of(rank).cpu(), "is a CPU tensor (host memory) but the communicator uses the cuda"),
                         (torch.zeros(4, 4, device=dev).t(), "is not contiguous")):
            try:
                comm.quant_all_gather(bad)
            except ValueError as e:
                assert msg in str(e), str(e)
            else:
                raise AssertionError(f"no error for {msg}")
        comm.close()

        # Wrapping torch's own NCCL communicator: only when the process maps one NCCL (see zpccl/_torch.py) and
        # this torch exposes the pointer (private API).
        ptr_of = getattr(dist.group.WORLD._get_backend(dev), "_comm_ptr", None)
        libs = zp.loaded_nccl_libraries()
        print(f"rank {rank}: NCCL libraries mapped: {libs}; _comm_ptr: {ptr_of is not None}", flush=True)
        if ptr_of is not None and len(libs) == 1 and int(ptr_of()):
            with zp.Comm.from_nccl_comm(int(ptr_of())) as wrapped:
                assert (wrapped.nranks, wrapped.rank, wrapped.cuda_device) == (world, rank, rank)
                assert torch.equal(wrapped.quant_all_gather(shard_of(rank)), full)
            dist.barrier()  # torch's communicator still works after zpccl let go of it

        # Two emulated nodes of one rank each: hpZ groups of one.
        with zp.Comm.from_torch_group(ranks_per_node=1, weight_bits=4) as comm2:
            assert (comm2.node_count, comm2.hpz_size) == (world, 1)
            full4 = comm2.quant_all_gather(shard_of(rank))
            expected4 = np.concatenate([model.round_trip(b, model.BF16, 4, 256) for b in bits])
            assert np.array_equal(bf16_bits(full4), expected4)
            offset, count = comm2.hier_secondary_shard(full4.numel())
            assert torch.equal(comm2.hier_all_gather(full4[offset:offset + count].clone()), full4)
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


class CudaTensorsOnTwoGpus(unittest.TestCase):
    def test_collectives_in_two_processes(self) -> None:
        import_torch()
        if gpu_count() < 2:
            self.skipTest("needs 2 CUDA GPUs")
        import zpccl.launch

        zpccl.launch.set_default_env()
        os.environ.setdefault("ZPCCL_LIBRARY", zpccl.library_path())
        zpccl.launch.spawn(_gpu_worker, 2, timeout=600)


if __name__ == "__main__":
    unittest.main()
