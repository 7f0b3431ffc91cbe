"""ZeRO++ inside DeepSpeed: a ZeRO stage-3 engine on zpccl's collectives.

    import zpccl.deepspeed

    config = {..., "zero_optimization": {"stage": 3, "zero_quantized_weights": True,
                                         "zero_quantized_gradients": True, "zero_hpz_partition_size": 2},
              "zpccl": {"grad_block_size": 64}}                      # optional: the policy's other fields
    engine, optimizer, _, _ = zpccl.deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                         config=config)
    ...train as before (engine(x), engine.backward(loss), engine.step(), save_checkpoint, load_checkpoint)...
    zp = zpccl.deepspeed.session_of(engine)                          # .summary(), .disable()

or, on an engine ``deepspeed.initialize`` already made (plain ZeRO-3, with or without
``zero_hpz_partition_size``): ``zp = zpccl.deepspeed.enable(engine, weight_bits=8, grad_bits=4)``.

How the config reaches zpccl: DeepSpeed builds its ZeRO++ quantizer inside ``deepspeed.initialize`` (and cannot
without its CUDA kernels), so :func:`initialize` takes deepspeed.initialize's arguments, hands DeepSpeed the
config without ``zero_quantized_weights`` / ``zero_quantized_gradients`` (and without the ``"zpccl"`` section),
and serves what they asked for: qwZ at 8 bits, qgZ at 4 (DeepSpeed's widths), the section's fields (or
``policy=``) for the rest. ``zero_hpz_partition_size`` stays DeepSpeed's: it makes the hpZ groups and keeps the
secondary partitions (their lifecycle: made after the forward, dropped after each step and at checkpoints).
:func:`split_config` is the mapping alone, for a config that ``deepspeed.zero.Init`` must read too.

What zpccl serves, through the module-level functions ZeRO-3 looks up at call time (``_deepspeed`` names them):

* parameter all-gathers over the data-parallel group (forward, backward without hpZ, prefetch): qwZ,
  block-quantized (``weight_bits``); every rank's gathered weights are bit-identical. The fetches
  ``stage3_use_all_reduce_for_fetch_params`` would run as all-reduces are qwZ gathers too, as DeepSpeed's own
  quantized gathers take precedence over that setting (zpccl turns it off while it serves, and ``disable`` back);
* all-gathers over DeepSpeed's hpZ group, from the secondary partitions: hpZ, exact, inside the node. DeepSpeed
  gathers from them wherever they exist: in the backward, and in any forward that finds them, which is the first
  after ``deepspeed.initialize`` (DeepSpeed makes them when it partitions the model, from its own weights: the
  first step's weights are exact), a gradient-accumulation micro-step's after the first, and an eval forward after
  another without a step between. A step and a checkpoint drop them, so the next forward is qwZ, and makes them
  of the weights qwZ gathered. ``enable`` first checks, with every rank, that DeepSpeed's groups of k consecutive
  ranks are zpccl's hpZ groups (k consecutive local ranks of one node, from a multiple of k), and refuses
  otherwise. With no quantization at all (``weight_bits=None, grad_bits=None``, or a config with
  ``zero_hpz_partition_size`` alone), hpZ alone;
* gradient reduce-scatters (``reduce_scatter_coalesced``, and ``all_to_all_quant_reduce`` where the engine was
  built with DeepSpeed's own qgZ): qgZ (``grad_bits``), the average over the data-parallel group that DeepSpeed's
  returns; its predivide and postscale settings act around the call as they do around DeepSpeed's;
* the persistent parameters' gather after each step and after a checkpoint load (those smaller than
  ``stage3_param_persistence_threshold``, which ZeRO-3 keeps whole): exact, as DeepSpeed's and its ZeRO++'s, but
  one all-gather on DeepSpeed's own data-parallel group for all of them where DeepSpeed makes one per parameter
  (``persistent_gather`` in ``summary()``; the same bits, a network latency a parameter fewer). With
  ``weight_bits=None, grad_bits=None`` and no hpZ, zpccl serves this alone.

What stays DeepSpeed's, exact, as in DeepSpeed's own ZeRO++: ZeRO stages 1 and 2 (refused), the other gathers of
``param.all_gather``, which calls torch.distributed itself (``GatheredParameters`` and the 16-bit checkpoint
gathers; a parameter used outside its module's forward, the first time DeepSpeed meets it so: said once in the
``zpccl.deepspeed`` log and counted in ``summary()`` as ``deepspeed_all_gather_external``), gathers and
reductions over any other group (tensor, pipeline and expert parallel: said once), other element types, and the
bucket all-reduce of ``reduce_scatter: false``, and every collective of another engine of the process (zpccl
serves the one it was enabled on: its fetches and its optimizer's gradient reductions mark its calls; the others
are counted as ``deepspeed_all_gather_unserved`` and ``deepspeed_reduce_scatter_unserved``). Prefetch,
``overlap_comm``'s streams, contiguous gradients, gradient accumulation, ``eval`` and checkpoints work as they do
without zpccl.

Blocks and padding: blocks restart at parameter boundaries (``param_blocks``), and each call copies only
parameters' data into its blocks, zeros in the rest: the padding DeepSpeed leaves uninitialized (the last ranks'
partition tails, the reduce-scatter's chunk padding) never reaches a block, whatever it holds, at enable, in every
call and after ``load_checkpoint``. bf16, fp16 and fp32 travel natively; any parameter size (1-D, smaller than the
world, odd) and any node count; deterministic.

Communicators: two over the data-parallel group (one for the gathers, also serving hpZ; one for the reduce-scatters,
so that DeepSpeed's gather and reduce streams overlap): cuda-backend on CUDA, host-backend with DeepSpeed's CPU
accelerator over gloo, ranks as processes (:meth:`zpccl.Comm.from_torch_group`). The node layout is the
policy's ``ranks_per_node`` / ``node_id``, else (on the CPU) the launcher's ``LOCAL_WORLD_SIZE``, else the host.
Memory beyond DeepSpeed's: between calls, none in torch's allocator but a few zeros; the communicators' scratch
outside it. A call's staging is its own, sized to it: a gather whose parameters' parts do not all start on block
boundaries stages them in n x its staged partition while it runs; a reduce-scatter's staging (n x its chunks, each
padded to a block) takes the place of the flat buffer DeepSpeed's own reduce-scatter allocates, and like it holds
the chunks returned (views) until DeepSpeed has read them.

Versions: DeepSpeed 0.19 or later (read in 0.19.8; older ones are refused, naming the version needed).
Inside, one module per concern: ``_api`` (what users call), ``_config`` (the config), ``_state`` (the session,
its communicators, what it replaces), ``_collectives`` (what the replaced functions run), ``_deepspeed``
(DeepSpeed as installed). The policy (:class:`~zpccl.ZeroPlusPlusPolicy`), the staging (``zpccl/_staging.py``) and
the counters (``zpccl/_report.py``) are shared with zpccl.fsdp.
"""
from __future__ import annotations

from .._policy import ZeroPlusPlusPolicy
from .._report import PathStats
from ._api import disable, enable, initialize, session_of
from ._config import split_config
from ._deepspeed import CHECKED_DEEPSPEED, MIN_DEEPSPEED
from ._state import ZeroPlusPlus

__all__ = ["CHECKED_DEEPSPEED", "MIN_DEEPSPEED", "PathStats", "ZeroPlusPlus", "ZeroPlusPlusPolicy", "disable",
           "enable", "initialize", "session_of", "split_config"]
