"""ZeRO++ inside PyTorch FSDP2: one call switches a ``fully_shard``-ed model to zpccl's collectives.

    from torch.distributed.fsdp import fully_shard
    import zpccl.fsdp

    for block in model.blocks:
        fully_shard(block, reshard_after_forward=2)     # 2: keep a 1/2 slice after forward (hpZ groups of 2)
    fully_shard(model)
    zp = zpccl.fsdp.enable(model, weight_bits=8, grad_bits=4, block_size=256)
    ...train as before...
    zp.disable()                                        # back to FSDP's own collectives (NCCL)

It goes through FSDP2's own hooks, ``FSDPModule.set_custom_all_gather`` and ``set_custom_reduce_scatter``
(torch 2.9 and later):

* all-gathers over the shard group (forward, prefetch, and backward with ``reshard_after_forward=True``): qwZ,
  block-quantized weights (``weight_bits``); every rank's gathered weights are bit-identical;
* the backward all-gather over FSDP's post-forward group (``reshard_after_forward=k``, k ranks of one node):
  hpZ, exact, inside the node. Each module's own k counts (a root left at its default has no such gather), and
  modules over one shard group may use several. FSDP's groups of k must be zpccl's hpZ groups (k consecutive
  ranks of one node, in order): ``enable`` checks it on every rank for every k and refuses otherwise, naming the
  modules. Where a front end takes only a bool (torchtitan, Accelerate), ``hpz_size=k`` gives the modules
  sharded with ``reshard_after_forward=True`` FSDP's post-forward groups of k ranks, built by FSDP's own
  post-forward mesh machinery (private: ``enable`` checks the installed torch has it), exactly what
  ``reshard_after_forward=k`` builds; ``disable`` puts FSDP's back. Memory, as with ``reshard_after_forward=k``:
  each rank keeps 1/k of such a module's parameters from its forward to its backward;
* gradient reduce-scatters: qgZ (``grad_bits``), fp32 or bf16 (FSDP's ``reduce_dtype``), for every reduction
  FSDP asks for: Sum, Avg, and the PreMulSum(1/f) that ``set_gradient_divide_factor(f)`` brings when f is not
  the shard group's size (torchtitan sets f = 1.0, a plain sum, on every module). PreMulSum is served as FSDP's
  ``set_force_sum_reduction_for_comms(True)`` path does it: a sum, then the output divided by f on the same
  stream, the same gradients bit for bit. With HSDP (or an all-reduce hook) that division comes before the
  replicate all-reduce (or the hook), as PreMulSum's does, where the force-sum path divides after it: the same
  bits where dividing by f is exact (1, powers of two), else equal up to rounding.

zpccl serves each FSDP parameter group once, however many modules share it (``fully_shard([m1, m2])``), and
through one ``enable`` at a time: ``enable`` on a module inside a served model, or on a model around a served
module, is refused until the first is disabled.

What zpccl does not serve stays on FSDP's collectives, and the ``zpccl.fsdp`` logger says so once per kind:
groups FSDP gathers as uint8 (their parameters mix dtypes), element types other than fp16/bf16/fp32, groups
other than the shard and hpZ groups (``hpz=False`` leaves the hpZ gather on NCCL too, and so does a
post-forward group set after ``enable``), the replicate dimension of a 2-D (HSDP) mesh, whose all-reduce
FSDP makes itself, and modules sharded over a group of one rank, where FSDP communicates nothing (``enable``
makes nothing for them, and says so as a warning when no module is left for zpccl). ``weight_bits=None`` leaves
every all-gather on FSDP's collectives (qgZ only), ``grad_bits=None`` every reduce-scatter (qwZ and hpZ only).

Blocks and parameters: FSDP concatenates the padded shards of a module's parameters into one flat buffer per
rank, so a quantization block could hold the end of a LayerNorm weight (values near 1) and the start of a
linear weight (values near 0.02), whose small values would then keep few bits. With ``param_blocks=True``
(default) blocks restart at every parameter boundary, as they restart at every rank's shard: the call copies
the flat buffer into a staging buffer where each parameter's part starts on a block boundary (zeros between,
which change no block's scale), runs the collective there (a reduce-scatter in place), and copies the result
back. Those buffers are reserved when ``enable`` runs, with the communicators' scratch, so that nothing
allocates in the training loop (:attr:`ZeroPlusPlus.reserved_bytes`).

Memory, beyond FSDP's own: the hooks fill FSDP's all-gather and reduce-scatter buffers and allocate nothing per
call. In torch's caching allocator: the two staging buffers, each of n x S elements (n ranks, S the largest
parameter group's staged shard: its parameters' padded shards, each but the last rounded up to a block), one in
the gathers' element type and one in the reduce-scatters' (:attr:`ZeroPlusPlus.reserved_bytes`); error
feedback's residuals when on; a few zero blocks. Outside it, allocated by the library: each communicator's
scratch, reserved for its largest collective (zpCommReserve, include/zpccl.h), and the NCCL communicators zpccl
makes (the reduce-scatters' own, and each one's node-layout splits) with their connection buffers, which NCCL
sizes. ``perf/fsdp_memory.py`` measures each part against FSDP2 with NCCL.

Gradient rounding (include/zpccl.h, "Gradient rounding"): ``grad_rounding="stochastic"`` (with ``seed``) rounds qgZ's
gradients stochastically, unbiased, in both of its quantizations; ``error_feedback=True`` keeps, per parameter group,
a bf16 residual of what the last reduce-scatter's quantization lost (the size of the group's reduce-scatter input,
staged layout included) and, on two-hop layouts, the intermediate hop's residual (1/local size of it). They are
allocated, zeroed, when ``enable`` runs; :attr:`ZeroPlusPlus.residual_bytes` and the ``"grad_residuals"`` entry of
:meth:`ZeroPlusPlus.summary` say how much memory they hold. A call whose input does not have the size the residual
was made for (FSDP reducing a subset of the group's parameters) runs without feedback, and the log says so once.

Communicators are made from the model's own process groups (the user passes nothing else): one for the
gathers and one for the reduce-scatters of each shard group, so that FSDP's all-gather and reduce-scatter
streams really overlap (one communicator serializes its calls). The gathers' communicator also serves hpZ for
one post-forward group size (the smallest); each further size over the same shard group gets an hpZ
communicator of its own. On CUDA they are cuda-backend communicators (``Comm.from_torch_group``: the gathers'
and the hpZ ones wrap the group's NCCL communicator when torch and zpccl share one NCCL library); with CPU
parameters, host-backend communicators: over the groups' own collectives when the ranks are processes (gloo, under
torchrun: the node layout is the launcher's, ``LOCAL_WORLD_SIZE``, unless ``ranks_per_node`` says otherwise), or
among threads under torch's threaded process group (as torch's own FSDP tests run).

Inside, one module per concern: ``_api`` (``enable``, ``disable``, ``session_of``), ``_state`` (:class:`ZeroPlusPlus`
and what it serves), ``_hooks`` (what FSDP calls) and ``_collectives`` (what they run: qwZ, hpZ, qgZ, the
fallbacks, the reserved buffers), ``_groups`` (the communicators), ``_post_forward`` (``hpz_size``), ``_report``
(counters and the log) and ``_torch_fsdp`` (torch's FSDP2 as the installed torch has it). The policy
(:class:`~zpccl.ZeroPlusPlusPolicy`, ``zpccl/_policy.py``) and the staging (:class:`BlockLayout`,
``zpccl/_staging.py``) belong to no integration: other integrations take them from there.
"""
from __future__ import annotations

from .._policy import ZeroPlusPlusPolicy
from .._staging import BlockLayout
from ._api import disable, enable, session_of
from ._report import PathStats
from ._state import ZeroPlusPlus
from ._torch_fsdp import MIN_TORCH

# Reached by the tests and perf/'s scripts under these names.
from ._collectives import op_name as _op_name
from ._torch_fsdp import TorchFsdp as _Fsdp

__all__ = ["BlockLayout", "MIN_TORCH", "PathStats", "ZeroPlusPlus", "ZeroPlusPlusPolicy", "disable", "enable",
           "session_of"]
