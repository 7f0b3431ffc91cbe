"""What zpccl.fsdp tells: per-path counters (calls, logical and wire bytes) and the ``zpccl.fsdp`` log, where
each kind of message is said once."""
from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("zpccl.fsdp")


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
    """The counters of one session, and the kinds of message it has said."""

    def __init__(self) -> None:
        self.stats: dict[str, PathStats] = {}
        self._said: set[str] = set()

    def count(self, path: str, logical: int, wire: int) -> None:
        self.stats.setdefault(path, PathStats()).add(logical, wire)

    def say_once(self, kind: str, message: str, level: int = logging.WARNING) -> None:
        if kind not in self._said:
            self._said.add(kind)
            log.log(level, "zpccl.fsdp: %s", message)
