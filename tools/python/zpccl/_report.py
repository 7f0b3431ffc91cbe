"""What a framework integration of zpccl tells, shared by every integration: per-path counters (calls, logical
and wire bytes) and its log, where each kind of message is said once. An integration gives :class:`Report` its own
logger (``zpccl.fsdp``, ``zpccl.deepspeed``), whose name prefixes every message."""
from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["PathStats", "Report"]


@dataclass
class PathStats:
    """What one path served: calls, logical (unquantized) bytes of the collective's output, and the bytes this
    rank's data occupied on the wire ((n - 1) copies of its shard's or slices' payloads)."""

    calls: int = 0
    logical_bytes: int = 0
    wire_bytes: int = 0

    def add(self, logical: int, wire: int) -> None:
        self.calls += 1
        self.logical_bytes += logical
        self.wire_bytes += wire


class Report:
    """The counters of one session, and the kinds of message it has said on ``log``."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.stats: dict[str, PathStats] = {}
        self._said: set[str] = set()

    def count(self, path: str, logical: int, wire: int) -> None:
        self.stats.setdefault(path, PathStats()).add(logical, wire)

    def say_once(self, kind: str, message: str, level: int = logging.WARNING) -> None:
        if kind not in self._said:
            self._said.add(kind)
            self.log.log(level, "%s: %s", self.log.name, message)

    def summary(self) -> dict[str, dict[str, int]]:
        """The counters as plain dicts, by path: ``{"qwz": {"calls": .., "logical_bytes": .., "wire_bytes": ..}}``."""
        return {k: dict(calls=v.calls, logical_bytes=v.logical_bytes, wire_bytes=v.wire_bytes)
                for k, v in sorted(self.stats.items())}
