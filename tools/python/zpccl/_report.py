"""What a framework integration of zpccl tells, shared by every integration: per-path counters (calls, logical
and wire bytes, the wire bytes by one rule for every path) and its log, where each kind of message is said once,
among them why a call stays on the framework's own collective. An integration gives :class:`Report` its own
logger (``zpccl.fsdp``, ``zpccl.deepspeed``), whose name prefixes every message."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from .comm import payload_size

__all__ = ["PathStats", "Report", "all_reduce_wire_bytes", "exact_wire_bytes", "quantized_wire_bytes"]


@dataclass
class PathStats:
    """What one path served: calls, logical (unquantized) bytes of the collective's output, and the bytes this
    rank's data occupied on the wire ((n - 1) copies of its shard's or slices' payloads: the functions below)."""

    calls: int = 0
    logical_bytes: int = 0
    wire_bytes: int = 0

    def add(self, logical: int, wire: int) -> None:
        self.calls += 1
        self.logical_bytes += logical
        self.wire_bytes += wire


def quantized_wire_bytes(nranks: int, count: int, bits: int, block_size: int) -> int:
    """A qwZ all-gather's or qgZ reduce-scatter's: this rank's payload of ``count`` elements (its shard, or its
    slices for each peer together), to each of the other ranks."""
    return (nranks - 1) * payload_size(count, bits, block_size)


def exact_wire_bytes(nranks: int, nbytes: int) -> int:
    """An exact all-gather's (hpZ) among ``nranks`` ranks: this rank's ``nbytes`` to each of the others."""
    return (nranks - 1) * nbytes


def all_reduce_wire_bytes(nranks: int, shard: int, bits: int, block_size: int) -> int:
    """A quantized all-reduce's: its reduce-scatter's payloads of a ``shard``, then the reduced shard's payload
    gathered by the other ranks."""
    return 2 * quantized_wire_bytes(nranks, shard, bits, block_size)


class Report:
    """The counters of one enable, and the kinds of message it has said on ``log``. ``own`` names the
    framework's own collectives and ``prefix`` starts the counters of the calls left on them (:meth:`fallback`)."""

    def __init__(self, log: logging.Logger, own: str = "the framework's own collective", prefix: str = "") -> None:
        self.log, self.own, self.prefix = log, own, prefix
        self.stats: dict[str, PathStats] = {}
        self._said: set[str] = set()

    def count(self, path: str, logical: int, wire: int) -> None:
        self.stats.setdefault(path, PathStats()).add(logical, wire)

    def say_once(self, kind: str, message: str, level: int = logging.WARNING) -> None:
        if kind not in self._said:
            self._said.add(kind)
            self.log.log(level, "%s: %s", self.log.name, message)

    def fallback(self, kind: str, message: str, call: Callable[[], Any], level: int = logging.WARNING) -> Any:
        """Runs ``call``, the framework's own collective, for a call zpccl does not serve: counted under the
        prefixed ``kind``, and ``message`` (why) said once a kind."""
        self.say_once(kind, f"{message}; it stays on {self.own}", level)
        self.count(self.prefix + kind, 0, 0)
        return call()

    def summary(self) -> dict[str, dict[str, int]]:
        """The counters as plain dicts, by path: ``{"qwz": {"calls": .., "logical_bytes": .., "wire_bytes": ..}}``."""
        return {k: dict(calls=v.calls, logical_bytes=v.logical_bytes, wire_bytes=v.wire_bytes)
                for k, v in sorted(self.stats.items())}
