"""The objects FSDP2 calls in place of its own collectives (``FSDPModule.set_custom_all_gather`` and
``set_custom_reduce_scatter``): subclasses of the installed torch's ``AllGather`` and ``ReduceScatter`` that keep
FSDP's buffer allocation and hand each call to :class:`~zpccl.fsdp._collectives.Collectives`, with FSDP's
previous collective for what zpccl does not serve."""
from __future__ import annotations

from typing import Any

from ._collectives import Collectives


def hook_classes(all_gather_base: type, reduce_scatter_base: type) -> tuple[type, type]:
    """The all-gather and reduce-scatter hook classes over this torch's FSDP2 base classes."""

    class ZeroAllGather(all_gather_base):  # type: ignore[misc, valid-type]
        """qwZ over the shard group, hpZ over the post-forward group, FSDP's own all-gather otherwise."""

        def __init__(self, collectives: Collectives, served: Any, fallback: Any) -> None:
            self.collectives, self.served, self.fallback = collectives, served, fallback

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return self.fallback.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
            return self.collectives.all_gather(self.served, output_tensor, input_tensor, group, async_op,
                                               self.fallback)

    class ZeroReduceScatter(reduce_scatter_base):  # type: ignore[misc, valid-type]
        """qgZ over the shard group, FSDP's own reduce-scatter otherwise."""

        def __init__(self, collectives: Collectives, served: Any, fallback: Any) -> None:
            self.collectives, self.served, self.fallback = collectives, served, fallback

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return self.fallback.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            return self.collectives.reduce_scatter(self.served, output_tensor, input_tensor, group, op, async_op,
                                                   self.fallback)

    return ZeroAllGather, ZeroReduceScatter
