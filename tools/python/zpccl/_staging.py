"""Staging for blocks that restart at parameter boundaries, shared by the framework integrations.

A framework hands a collective one flat buffer per rank holding several parameters' parts back to back (FSDP2's
padded shards of a module's parameters; DeepSpeed's partitions). :class:`BlockLayout` says where each part goes
so that it starts on a quantization block, and copies a buffer into that layout and back; :class:`Staging` is the
reserved buffer the staged copy lives in while the collective runs. Neither imports torch (the caller passes it)
nor any integration.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

__all__ = ["BlockLayout", "Staging"]


@dataclass(frozen=True)
class BlockLayout:
    """Where each parameter's part of a flat per-rank buffer goes so that it starts on a block boundary.

    ``sizes`` are the parts' element counts in buffer order; each part but the last is padded to a multiple of
    ``block_size`` (the last one's partial block ends at the shard's end, where blocks restart anyway).
    """

    sizes: tuple[int, ...]
    block_size: int
    staged_offsets: tuple[int, ...] = field(init=False)
    staged_count: int = field(init=False)
    #: Each part's zeros up to its slot's end (the last part's: 0).
    pads: tuple[int, ...] = field(init=False)
    #: The staged layout as runs, a part then its zeros where it has any, and which runs hold the parts: one
    #: ``split`` of a staged row gives every part's view (the calls run per collective: one split, not a view
    #: per part, keeps their host time low).
    staged_runs: tuple[int, ...] = field(init=False)
    part_runs: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        offsets, pads, runs, part_runs, at = [], [], [], [], 0
        for i, n in enumerate(self.sizes):
            pad = 0 if i == len(self.sizes) - 1 else -(-n // self.block_size) * self.block_size - n
            offsets.append(at)
            pads.append(pad)
            part_runs.append(len(runs))
            runs += [n, pad] if pad else [n]
            at += n + pad
        for name, value in (("staged_offsets", tuple(offsets)), ("staged_count", at), ("pads", tuple(pads)),
                            ("staged_runs", tuple(runs)), ("part_runs", tuple(part_runs))):
            object.__setattr__(self, name, value)

    @property
    def count(self) -> int:
        return sum(self.sizes)

    @property
    def identity(self) -> bool:
        """Every part already starts on a block boundary: no staging needed."""
        return self.staged_count == self.count

    def stage(self, torch: Any, src: Any, dst: Any, zeros: Any) -> None:
        """``dst`` (rows x staged_count) <- ``src`` (rows x count), each part on a block boundary, zeros between."""
        pieces = []
        for part, pad in zip(src.split(self.sizes, dim=-1), self.pads):
            pieces.append(part)
            if pad:
                pieces.append(zeros.narrow(-1, 0, pad))
        torch.cat(pieces, dim=-1, out=dst)

    def slot(self, i: int) -> int:
        """Elements part ``i`` occupies in the staged layout: its size and the zeros up to the next block."""
        return self.sizes[i] + self.pads[i]

    def fill(self, torch: Any, rows: list[list[Any]], dst: Any, zeros: Any) -> None:
        """``dst`` (len(rows) x staged_count, contiguous) <- ``rows[r][i]``, 1-D tensors of at most ``sizes[i]``
        elements each, on their block boundaries, zeros in the rest of each slot: for buffers whose parts the
        framework pads with values nobody initialized (DeepSpeed's partitions), only the data reaches a block.
        ``zeros`` is 1-D and at least as long as the largest gap."""
        pieces = []
        for row in rows:
            for i, part in enumerate(row):
                gap = self.slot(i) - part.numel()
                if gap < 0 or gap > zeros.numel():
                    raise ValueError(f"BlockLayout.fill: part {i} of {part.numel()} elements in a slot of "
                                     f"{self.slot(i)}, with {zeros.numel()} zeros")
                pieces.append(part)
                if gap:
                    pieces.append(zeros.narrow(0, 0, gap))
        torch.cat(pieces, out=dst.view(-1))

    def unstage(self, torch: Any, src: Any, dst: Any) -> None:
        """``dst`` (rows x count) <- the parts of ``src`` (rows x staged_count)."""
        runs = src.split(self.staged_runs, dim=-1)
        torch.cat([runs[i] for i in self.part_runs], dim=-1, out=dst)


class Staging:
    """A reserved byte buffer handed out as typed views, one collective at a time. The collectives that share it
    may run on several streams (FSDP gathers on one and reduce-scatters on another, and an explicit
    ``unshard(async_op=True)`` gathers on the caller's): a use on another stream than the last waits for the last
    one's work first."""

    def __init__(self, torch: Any, device: Any, nbytes: int) -> None:
        self.torch, self.device = torch, device
        self.buffer = torch.empty(max(nbytes, 0), dtype=torch.uint8, device=device)
        self.grown = False
        self._cuda = device.type == "cuda"
        self._last: tuple[Any, Any] | None = None  # (stream, event recorded after its use)

    def view(self, count: int, dtype: Any) -> Any:
        nbytes = count * dtype.itemsize
        if nbytes > self.buffer.numel():
            self.buffer = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)
            self.grown = True
        return self.buffer.narrow(0, 0, nbytes).view(dtype)

    @contextmanager
    def rows(self, nranks: int, rank: int, count: int, dtype: Any) -> Iterator[tuple[Any, Any]]:
        """For one staged collective: the buffer as ``nranks`` rows of ``count`` elements (a 1-D view) and this
        rank's own row in it, used between :meth:`begin` and :meth:`end`."""
        self.begin()
        staged = self.view(nranks * count, dtype)
        try:
            yield staged, staged.narrow(0, rank * count, count)
        finally:
            self.end()

    def begin(self) -> None:
        """Orders this use after the previous one, when that was on another stream."""
        if self._cuda and self._last is not None:
            stream = self.torch.cuda.current_stream(self.device)
            if stream != self._last[0]:
                stream.wait_event(self._last[1])

    def end(self) -> None:
        if self._cuda:
            stream = self.torch.cuda.current_stream(self.device)
            event = self._last[1] if self._last is not None else self.torch.cuda.Event()
            event.record(stream)
            self._last = (stream, event)
