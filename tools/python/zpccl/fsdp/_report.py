"""What zpccl.fsdp tells: the shared counters (:mod:`zpccl._report`) on the ``zpccl.fsdp`` log."""
from __future__ import annotations

import logging

from .._report import PathStats, Report as _Report

__all__ = ["PathStats", "Report", "log"]

log = logging.getLogger("zpccl.fsdp")


class Report(_Report):
    """The counters of one zpccl.fsdp session, and the kinds of message it has said on ``zpccl.fsdp``."""

    def __init__(self) -> None:
        super().__init__(log, own="FSDP's own collective", prefix="torch_")
