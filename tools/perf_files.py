"""The perf binaries' JSON files (``-J``), as Python tools read them (tools/model/json_in.h is the C++ reader).

A file is ``{"provenance": {...}, "rows": [row, ...]}`` (perf/json_out.h; the provenance's keys are
perf/provenance.py's), or, gathering several such files (tools/gpu-check.sh's results.json), ``{"provenance_by_file":
{file: {...}}, "rows": [row, ...]}`` with each row naming its ``file``; files written before provenance was recorded are a bare array of rows, and stay readable.
A row is a perf row when it names its ``op``; other files (perf/fsdp_step.py's, whose rows name a ``config``)
give none.

    from perf_files import load
    provenance, rows = load("perf/results/x.json")    # provenance is None for a bare array
"""
from __future__ import annotations

import json
import pathlib
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
