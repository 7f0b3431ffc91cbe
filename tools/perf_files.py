"""The perf binaries' JSON files (``-J``), as Python tools read them (tools/model/json_in.h is the C++ reader).

A file is ``{"provenance": {...}, "rows": [row, ...]}`` (perf/json_out.h; the provenance's keys are
perf/provenance.py's), or, gathering several such files (tools/gpu-check.sh's results.json), ``{"provenance_by_file":
{file: {...}}, "rows": [row, ...]}`` with each row naming its ``file``; files written before provenance was recorded are a bare array of rows, and stay readable.
A row is a perf row when it names its ``op``; other files (the training steps', whose rows name a ``config``:
:func:`is_step_file`) give none. Sizes are written as the perf flags spell them (:func:`size_text`,
:func:`size_of`).

    from perf_files import load
    provenance, rows = load("perf/results/x.json")    # provenance is None for a bare array
"""
from __future__ import annotations

import json
import pathlib
import re
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "perf"))
from provenance import recorded_source  # noqa: E402


def rows_of(data: Any) -> list[dict[str, Any]]:
    """The perf rows of a parsed file, of either shape; [] for anything else."""
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        return []
    return [r for r in rows if isinstance(r, dict) and "op" in r]


def provenance_of(data: Any) -> dict[str, Any] | None:
    """The file's provenance record, or None (a bare array, or a file that records none). Its commit and dirty are
    the ones it stands for (perf/provenance.py's recorded_source)."""
    if isinstance(data, dict) and isinstance(data.get("provenance_by_file"), dict):
        return _one_source(list(data["provenance_by_file"].values()))
    p = data.get("provenance") if isinstance(data, dict) else None
    if not isinstance(p, dict):
        return None
    commit, dirty = recorded_source(p)
    return dict(p, commit=commit, dirty=dirty)


def _one_source(records: list[Any]) -> dict[str, Any] | None:
    """The record standing for a file that gathers several runs' files (tools/gpu-check.sh's results.json): the first
    run's, when every run stands for the same tree; None when they differ or one records nothing."""
    if not records or not all(isinstance(r, dict) for r in records):
        return None
    sources = {recorded_source(r) for r in records}
    if len(sources) != 1:
        return None
    commit, dirty = sources.pop()
    return dict(records[0], commit=commit, dirty=dirty, runs=len(records))


def load(path: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(provenance, rows) of one file; OSError or ValueError when it cannot be read as JSON."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return provenance_of(data), rows_of(data)


def is_step_file(data: Any) -> bool:
    """Whether a parsed file is a training step's (perf/step_protocol.py's scripts: perf/fsdp_step.py,
    perf/ddp_step.py, perf/deepspeed_step.py): a dict whose rows each name a ``config``, with rows or loss runs (a
    ``--loss-only`` run has no rows; a perf binary's file without rows has no ``losses``)."""
    rows = data.get("rows") if isinstance(data, dict) else None
    return (isinstance(rows, list) and all(isinstance(r, dict) and "config" in r for r in rows)
            and (bool(rows) or isinstance(data.get("losses"), list)))


def exchanging_calls(calls: dict[str, int]) -> int:
    """The collective calls of a step row's ``calls_per_step`` that exchange data: a no-comm configuration's
    ``local_`` ones move nothing between ranks."""
    return sum(v for k, v in calls.items() if not k.startswith("local_"))


UNITS = (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def size_text(nbytes: float, digits: int | None = None) -> str:
    """Bytes with a binary suffix. ``digits`` None: a size's name, as the perf flags spell it (whole units of the
    largest suffix whose remainder is at most a hundredth of it, so that a size rounded up to whole elements keeps
    its flag's name: 64M, 15872K, 1536M, 1000); else rounded to that many significant digits, for reading (1.5G,
    3.56K)."""
    for suffix, scale in UNITS:
        if digits is None and nbytes >= scale and nbytes % scale < scale // 100 + 1:
            return f"{round(nbytes / scale)}{suffix}"
        if digits is not None and nbytes >= scale:
            return f"{nbytes / scale:.{digits}g}{suffix}"
    return str(nbytes) if digits is None else f"{nbytes:.0f}"


def size_of(text: str) -> int:
    """Bytes from a size as the perf flags and size_text spell it: 4096, 64K, 16M, 1G (the suffix in either case;
    a decimal before a suffix, 1.5G, is rounded down to whole bytes). ValueError names the text."""
    m = re.fullmatch(r"(\d+)(\.\d+)?([KMG]?)", text.strip(), re.I)
    if m is None or (m.group(2) and not m.group(3)):
        raise ValueError(f"size_of: {text!r} is not a size (bytes, or a number and K, M or G: 64K, 16M, 1.5G)")
    scale = dict(UNITS).get(m.group(3).upper(), 1)
    whole = int(m.group(1)) * scale
    return whole + int(float("0" + m.group(2)) * scale) if m.group(2) else whole
