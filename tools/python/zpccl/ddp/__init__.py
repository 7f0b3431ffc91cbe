"""zpccl's quantized all-reduce for data-parallel gradients: DDP's communication hook, and HSDP's replicate
all-reduce through FSDP2's all-reduce hook.

DDP (one replica of the model per rank):

    import zpccl.ddp
    model = DistributedDataParallel(model, process_group=group)
    zp = zpccl.ddp.enable(model, grad_bits=8, block_size=256)   # collective; before the first backward
    ...train as before; zp.summary() counts the calls and bytes...

Every bucket DDP hands its hook is averaged over the group by zpQuantAllReduce (include/zpccl.h, "Quantized
all-reduce"): qgZ's reduce-scatter of one shard a rank, then the gather of the reduced shards in qwZ's format, one
hop or two (several nodes of several ranks). Every rank's gradients are bit-identical, so replicas never drift;
deterministic; the error bound is the header's. Over a group of one rank nothing travels and the gradients stay
exact (said once in the log). Blocks restart at each parameter of a bucket (``param_blocks``,
through a staging buffer sized once for DDP's largest bucket), so that a large gradient's scale never swallows a
small neighbour's. The state (:class:`QuantAllReduce`) is made once: the communicator over DDP's process group,
its scratch and the staging buffer reserved, so that a call allocates no buffer. Options are the gradient fields of
:class:`~zpccl.ZeroPlusPlusPolicy` (``grad_bits``, ``block_size``, ``grad_block_size``, ``param_blocks``,
``grad_rounding``, ``seed``, ``ranks_per_node``, ``node_id``), or ``policy=``; error feedback is refused (DDP
rebuilds its buckets after the first iteration). :func:`make_state` and :func:`comm_hook` compose it by hand.
Compiled DDP is served through either reducer: the C++ one hands the hook buckets, the Python one
(``optimize_ddp="python_reducer"``, compiled autograd) each parameter's gradient, with the same bits. The state
holds a communicator and does not pickle: ``torch.save``/``copy.deepcopy`` of the hooked model are refused, naming
what to save instead.

HSDP (FSDP2 sharding inside a node, replicas across nodes): shard on the 1-D shard mesh and let zpccl serve the
replicate dimension, whose all-reduce is the traffic across nodes:

    mesh = init_device_mesh("cuda", (replicas, ranks_per_node), mesh_dim_names=("replicate", "shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    zp = zpccl.ddp.enable_replicate(model, mesh["replicate"].get_group(), grad_bits=8)

:func:`enable_replicate` sets FSDP2's ``set_all_reduce_hook`` on every FSDP module: after the reduce-scatter over the
shard group, the reduced shard is averaged over the replicate group by zpQuantAllReduce. What this costs against
native HSDP (a 2-D mesh) is in README.md, "DDP and HSDP": FSDP knows only the shard mesh (checkpoints, parameters'
initialization), and the gradients take one more quantization round trip than qgZ alone. Accumulation with
``set_requires_all_reduce(False)`` is honoured: those micro-batches' shards are summed and all-reduced once with the
next one that all-reduces.

Backends: CUDA tensors over an NCCL group (the cuda backend: qgZ's path, then qwZ's), or CPU tensors over a gloo
group (the host backend, ranks as processes): the same bits.
"""
from __future__ import annotations

from ._api import FIELDS, comm_hook, enable, enable_replicate, make_state
from ._state import QuantAllReduce

__all__ = ["FIELDS", "QuantAllReduce", "comm_hook", "enable", "enable_replicate", "make_state"]
