#!/usr/bin/env python3
"""Paired statistics of loss runs: what a set of seeds says about a configuration's loss against its exact baseline.

    python3 tools/loss_stats.py                 # every campaign below, as Markdown tables
    python3 tools/loss_stats.py --json out.json # the same figures as JSON
    python3 tools/loss_stats.py --check         # fail on a loss file in perf/results/ that no campaign reads

A loss run is a row (configuration, seed, validation loss). A configuration is compared with its campaign's exact
baseline seed by seed: the two runs of one seed share the model's initialization and the data order, so their
difference is the configuration's effect plus the trajectory noise of one perturbed run, and the seeds are the
sample. Per configuration:

* the paired relative gap of each seed, ``100 * (valid - valid_ref) / valid_ref`` (percent);
* n (seeds), the mean gap, its sample standard deviation s (n - 1 in the denominator), the standard error
  ``se = s / sqrt(n)``;
* the two-sided 95% interval ``mean ± t * se``, t the 0.975 quantile of Student's t with n - 1 degrees of freedom
  (:func:`t_quantile`, computed here: the standard library and NumPy have no t distribution);
* what the interval supports (:func:`verdict`), at a tolerance of X%:

  ==============================  ===========================================================================
  ``within ±X%``                  the whole interval lies inside [-X, +X]
  ``more than +X%``               the whole interval lies above +X: the configuration costs more than X
  ``below -X%``                   the whole interval lies below -X
  ``at most +X%``                 the interval lies below +X but reaches under -X: no cost above X, but
                                  "within" cannot be said
  ``cannot tell at X%``           the interval straddles +X
  ``one seed: no interval``       n = 1
  ==============================  ===========================================================================

  and, whatever the tolerance, the narrowest symmetric bound the interval supports, ``max(|lo|, |hi|)``, and the
  sign it resolves (``above`` the baseline when lo > 0, ``below`` when hi < 0, else none).

A mean inside the tolerance with an interval that straddles it is "cannot tell", never "met in the mean".
tools/render_results.py renders perf/RESULTS.md's and README's loss tables from the campaigns through this module,
and perf/deepspeed_step.py reports its loss runs with :func:`gap_cells`: one computation of every loss interval. The
training scripts' own summaries of their runs (perf/step_protocol.py's, perf/experiments/grad_numerics.py's) take
their gaps from :func:`gaps_by_config`: one computation of every paired gap.

Campaigns (:data:`CAMPAIGNS`) say which result files belong together (one setup: model, steps, schedule, layout),
which configuration is the exact baseline, and each configuration's tolerance. Runs are deterministic, so a
(configuration, seed) found in two files of a campaign must have the same validation loss: a difference is an
error (the files do not belong together). The files are read, never written.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

TOP = pathlib.Path(__file__).resolve().parent.parent
RESULTS = TOP / "perf" / "results"
LEVEL = 0.95  #: the intervals' coverage


# ---- Student's t ---------------------------------------------------------------------------------------------


def t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (a positive integer) degrees of freedom.

    The finite series in the angle theta = atan(t / sqrt(df)) that integrating the density gives for integer df:
    odd df: (2 / pi) (theta + sin(theta) (cos(theta) + 2/3 cos^3 + 2*4/(3*5) cos^5 + ... up to cos^(df-2)));
    even df: sin(theta) (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... up to cos^(df-2)).
    """
    if not isinstance(df, int) or isinstance(df, bool) or df < 1:
        raise ValueError(f"t_central: df {df!r} must be an int >= 1")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:
        if df == 1:
            return 2 / math.pi * theta
        term = total = math.cos(theta)
        for k in range(1, (df - 3) // 2 + 1):
            term *= (2 * k) / (2 * k + 1) * c2
            total += term
        return 2 / math.pi * (theta + s * total)
    term = total = 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= (2 * k - 1) / (2 * k) * c2
        total += term
    return s * total


def t_quantile(p: float, df: int) -> float:
    """The p quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom: q with P(T <= q) = p.

    Bisection on :func:`t_central` (P(T <= q) = (1 + P(|T| <= q)) / 2), to a relative 1e-12.
    """
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile: p {p!r} must be in (0.5, 1)")
    central = 2 * p - 1
    lo, hi = 0.0, 1.0
    while t_central(hi, df) < central:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        if t_central(mid, df) < central:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# ---- the statistics of one configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class GapStats:
    """The paired gaps (percent) of one configuration against its baseline, and their interval."""

    gaps: dict[int, float]  #: seed -> 100 * (valid - valid_ref) / valid_ref
    n: int
    mean: float
    sd: float | None  #: sample standard deviation (None for one seed)
    se: float | None
    t: float | None  #: the t quantile the interval uses
    lo: float | None
    hi: float | None
    level: float = LEVEL

    @property
    def seeds(self) -> list[int]:
        return sorted(self.gaps)

    @property
    def bound(self) -> float | None:
        """The narrowest X for which the interval supports "within ±X%"."""
        return None if self.lo is None else max(abs(self.lo), abs(self.hi))

    @property
    def sign(self) -> str:
        """``above`` (the whole interval above 0), ``below``, or ``none`` (it holds 0, or there is no interval)."""
        if self.lo is None:
            return "none"
        return "above" if self.lo > 0 else "below" if self.hi < 0 else "none"


def parse_seeds(text: str) -> list[int]:
    """"0,2,5-7" -> [0, 2, 5, 6, 7]: seeds and ranges FIRST-LAST of seeds, each seed once, in the order given (the
    step scripts' ``--loss-seeds``, tools/loss_jobs.py's ``--seeds``)."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:  # "0,1,": an empty part names nothing
            continue
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{part!r} is neither a seed nor a range FIRST-LAST of seeds")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"{part!r}: the range ends before it starts")
        seeds.extend(range(first, last + 1))
    if not seeds:
        raise ValueError("no seed")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"seed {repeated[0]} is given twice")
    return seeds


def paired_gaps(valid: dict[int, float], reference: dict[int, float]) -> dict[int, float]:
    """Per seed found in both, the relative gap of ``valid`` to ``reference`` in percent."""
    return {s: 100 * (v - reference[s]) / reference[s] for s, v in sorted(valid.items()) if s in reference}


def gaps_by_config(runs: Iterable[dict[str, Any]], reference: str, name: str = "config") -> dict[str, dict[int, float]]:
    """Per configuration of ``runs`` (rows naming it under ``name``, with ``seed`` and ``valid``; in first-seen
    order, a seed's first run taken), its paired_gaps to the ``reference`` configuration's runs; a configuration
    that shares no seed with the reference is left out. What the scripts' own summaries of their runs use
    (perf/step_protocol.py's loss_summary, perf/experiments/grad_numerics.py, tools/plot_grad_numerics.py)."""
    valid: dict[str, dict[int, float]] = {}
    for r in runs:
        valid.setdefault(r[name], {}).setdefault(r["seed"], r["valid"])
    gaps = {config: paired_gaps(v, valid.get(reference, {})) for config, v in valid.items()}
    return {config: g for config, g in gaps.items() if g}


def gap_stats(gaps: dict[int, float], level: float = LEVEL) -> GapStats:
    """Mean, standard error and two-sided ``level`` interval (Student's t, n - 1 degrees of freedom) of the gaps."""
    if not gaps:
        raise ValueError("gap_stats: no seed has both runs")
    values = [gaps[s] for s in sorted(gaps)]
    n, mean = len(values), statistics.fmean(values)
    if n == 1:
        return GapStats(dict(gaps), 1, mean, None, None, None, None, None, level)
    sd = statistics.stdev(values)
    se = sd / math.sqrt(n)
    t = t_quantile((1 + level) / 2, n - 1)
    return GapStats(dict(gaps), n, mean, sd, se, t, mean - t * se, mean + t * se, level)


def verdict(stats: GapStats, tolerance: float) -> str:
    """What the interval supports at a tolerance of ``tolerance`` percent (the module's table)."""
    if tolerance <= 0:
        raise ValueError(f"verdict: tolerance {tolerance!r} must be > 0 (percent)")
    x = f"{tolerance:g}%"
    if stats.lo is None:
        return "one seed: no interval"
    if stats.lo > tolerance:
        return f"more than +{x}"
    if stats.hi < -tolerance:
        return f"below -{x}"
    if stats.lo >= -tolerance and stats.hi <= tolerance:
        return f"within ±{x}"
    if stats.hi <= tolerance:
        return f"at most +{x}"
    return f"cannot tell at {x}"


def seeds_for_half_width(sd: float, half_width: float, level: float = LEVEL, limit: int = 100_000) -> int | None:
    """The fewest seeds whose interval's half width ``t(n - 1) * sd / sqrt(n)`` is at most ``half_width``, at a
    per-seed spread ``sd`` (None beyond ``limit``)."""
    if sd <= 0 or half_width <= 0:
        raise ValueError(f"seeds_for_half_width: sd {sd!r} and half_width {half_width!r} must be > 0")
    n = 2
    # A normal quantile's estimate first (t only widens it), then up one seed at a time.
    z = statistics.NormalDist().inv_cdf((1 + level) / 2)
    n = max(n, math.ceil((z * sd / half_width) ** 2))
    while n <= limit:
        if t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n) <= half_width:
            return n
        n += 1
    return None


# ---- result files ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One loss run: its configuration, seed and validation loss, and the file it came from."""

    config: str
    seed: int
    valid: float
    file: str


def runs_of_doc(doc: Any, name: str) -> list[Run]:
    """The loss runs of a parsed result file named ``name``: ``perf/fsdp_step.py``'s or ``perf/deepspeed_step.py``'s
    (``losses``: spec, seed, valid) or ``perf/experiments/grad_numerics.py``'s (``runs``: config, seed, valid). Rows
    without a seed are refused: they cannot be paired."""
    if isinstance(doc, dict) and "losses" in doc:
        rows = [(r.get("spec"), r.get("seed"), r.get("valid")) for r in doc["losses"]]
    elif isinstance(doc, dict) and "runs" in doc:
        rows = [(r.get("config"), r.get("seed"), r.get("valid")) for r in doc["runs"]]
    else:
        raise ValueError(f"{name}: neither 'losses' (fsdp_step) nor 'runs' (grad_numerics)")
    out = []
    for config, seed, valid in rows:
        if config is None or seed is None or valid is None:
            raise ValueError(f"{name}: a loss row without a configuration, seed or validation loss "
                             f"({config!r}, {seed!r}, {valid!r}): it cannot be paired")
        out.append(Run(str(config), int(seed), float(valid), name))
    return out


def runs_of_file(path: pathlib.Path) -> list[Run]:
    """The loss runs of a result file (:func:`runs_of_doc`)."""
    return runs_of_doc(json.loads(path.read_text()), path.name)


def merge_runs(runs: Iterable[Run]) -> dict[str, dict[int, Run]]:
    """configuration -> seed -> its run (the first file's); a (configuration, seed) seen twice must agree exactly."""
    table: dict[str, dict[int, Run]] = {}
    for r in runs:
        seen = table.setdefault(r.config, {}).get(r.seed)
        if seen is not None and seen.valid != r.valid:
            raise ValueError(f"{r.config} seed {r.seed}: validation loss {seen.valid!r} in {seen.file} but "
                             f"{r.valid!r} in {r.file}: a run is deterministic, so these files do not belong "
                             "to one campaign")
        table[r.config][r.seed] = seen or r
    return table


@dataclass(frozen=True)
class Campaign:
    """Result files of one setup, their exact baseline, and per configuration a label and tolerance (percent)."""

    name: str
    title: str
    files: tuple[str, ...]
    reference: str
    configs: dict[str, tuple[str, float | None]] = field(default_factory=dict)  #: config -> (label, tolerance)
    #: (config, against): paired gaps between two configurations of the campaign, seed by seed
    contrasts: tuple[tuple[str, str], ...] = ()
    #: (field, specs): the runs of these specs are named ``"<spec> <field>=<value>"`` by a top-level field of their
    #: file that sets a format ``--loss-runs`` does not name (``grad_block_size``), so that one campaign holds the
    #: runs of several values against the same exact runs; other specs' runs keep their names
    split_by: tuple[str, tuple[str, ...]] | None = None

    def config_of(self, doc: Any, spec: str) -> str:
        """The name in this campaign of the runs of ``spec`` in the file ``doc``."""
        if self.split_by is None or spec not in self.split_by[1]:
            return spec
        key = self.split_by[0]
        return f"{spec} {key}={doc.get(key)}"


#: The loss campaigns in perf/results/. Tolerances are the targets DESIGN.md and the issues set: int8 gradients
#: 0.1% and int4 0.5% on the 57M FSDP2 model and its DDP replica (issue 49); issue 33's 0.1% for every gradient
#: format of grad_numerics.py.
CAMPAIGNS = (
    Campaign(
        "fsdp2-57m", "57M FSDP2 model, 2 ranks as 2 nodes (net-on1gpu), 400 steps, cosine decay (fsdp_step.py)",
        ("2026-12-03-h200x1-fsdp-loss-cosine-35f8470.json", "2026-12-03-h200x1-fsdp-loss-cosine-seeds345-1bf77a3.json"),
        "nccl-noreshard",
        {"nccl-fp32": ("NCCL, fp32 reduction (noise floor)", None),
         "zpccl:8:4": ("zpccl int8 weights, int4 gradients (blocks of 256)", 0.5),
         "zpccl:8:8": ("zpccl int8 weights, int8 gradients", 0.1)}),
    Campaign(
        "fsdp2-57m-b64", "57M FSDP2 model as above, int4 gradients in blocks of 64, paired to NCCL with "
        "reshard_after_forward=True",
        ("2026-12-05-h200x1-fsdp-loss-int4-b64-1c1aab7.json",),
        "nccl",
        {"zpccl:8:4": ("zpccl int8 weights, int4 gradients in blocks of 64", 0.5)}),
    Campaign(
        "fsdp2-57m-constant", "57M FSDP2 model as above, constant learning rate (superseded by the cosine runs)",
        ("2026-12-02-h200x1-fsdp-loss-seeds-460dffb.json",),
        "nccl-noreshard",
        {"zpccl:8:4": ("zpccl int8 weights, int4 gradients", 0.5),
         "zpccl:0:4": ("zpccl bf16 weights, int4 gradients", 0.5),
         "zpccl:0:8": ("zpccl bf16 weights, int8 gradients", 0.1)}),
    Campaign(
        "ddp-57m-int4", "57M model as one DDP replica per rank, 2 ranks as 2 nodes (net-on1gpu; seeds 3-5 and 9-11 "
        "under MPS), 400 steps, cosine decay (ddp_step.py); zpccl: int4 gradients in blocks of 256",
        ("2026-12-05-h100x1-ddp-loss-int4-2edefb7.json",
         *(f"2026-12-06-h100x1-ddp-loss-int4-mps-seed{s}-94f9fee.json" for s in (3, 4, 5, 9, 10, 11))),
        "nccl",
        {"zpccl": ("zpccl.ddp, int4 gradients (blocks of 256)", 0.5),
         "bf16-compress": ("torch's bf16_compress_hook (a perturbation of the exact run)", None)}),
    Campaign(
        "ddp-57m-int8", "57M model as one DDP replica per rank, 2 ranks as 2 nodes (net-on1gpu; seeds 3-42 of blocks "
        "of 256, every seed of blocks of 64 and of torch's bf16_compress_hook under MPS, which moves no result: NCCL's "
        "and the hook's runs are the same to the last bit in every file that holds their seed), 400 steps, cosine "
        "decay (ddp_step.py); zpccl: int8 gradients",
        ("2026-12-06-h100x1-ddp-loss-int8-511ec81.json", "2026-12-06-h100x1-ddp-loss-int8-mps-seeds34-185ef4b.json",
         "2026-12-06-h100x1-ddp-loss-int8-mps-seeds567-0c6a455.json",
         "2026-12-06-h100x1-ddp-loss-int8-mps-seeds8910-0c6a455.json",
         "2026-12-06-h100x1-ddp-loss-int8-mps-seeds1112-0c6a455.json",
         *(f"2026-12-06-h100x1-ddp-loss-int8-mps-seeds{s}-960e181.json"
           for s in ("131415", "161718", "192021", "222324", "252627", "282930", "313233", "343536")),
         *(f"2026-12-07-h100x1-ddp-loss-int8-mps-seed{s}-128839a.json" for s in range(37, 43)),
         *(f"2026-12-07-h100x1-ddp-loss-int8-b64-mps-seed{s}-ff14e0a.json" for s in range(40)),
         *(f"2026-12-07-h100x1-ddp-loss-bf16c-mps-seed{s}-1ac985b.json" for s in range(40))),
        "nccl",
        {"zpccl grad_block_size=256": ("zpccl.ddp, int8 gradients (blocks of 256)", 0.1),
         "zpccl grad_block_size=64": ("zpccl.ddp, int8 gradients in blocks of 64", 0.1),
         "bf16-compress": ("torch's bf16_compress_hook (a perturbation of the exact run)", None)},
        (("zpccl grad_block_size=64", "zpccl grad_block_size=256"),
         ("zpccl grad_block_size=64", "bf16-compress"), ("zpccl grad_block_size=256", "bf16-compress")),
        split_by=("grad_block_size", ("zpccl",))),
    *(Campaign(
        f"ddp-small-cpu-int{bits}", f"2-layer d 128 GPT as one DDP replica per rank (gloo), 2 ranks as 2 nodes (host "
        f"backend), 300 steps, cosine decay (ddp_step.py --cpu); zpccl: int{bits} gradients in blocks of 256",
        (f"2026-12-06-cpu-ddp-loss-int{bits}-small-1109e71.json",),
        "nccl",
        {"zpccl": (f"zpccl.ddp, int{bits} gradients (blocks of 256)", tolerance)})
      for bits, tolerance in ((8, 0.1), (4, 0.5))),
    Campaign(
        "deepspeed-57m-b64", "57M model under DeepSpeed ZeRO-3, 2 ranks as 2 nodes (net-on1gpu-mps), 400 steps, "
        "cosine decay (deepspeed_step.py); zpccl.deepspeed: int8 weights, int4 gradients in blocks of 64",
        ("2026-12-06-h100x1-deepspeed-loss-b64-mps-185ef4b.json",
         *(f"2026-12-06-h100x1-deepspeed-loss-b64-mps-seed{s}-94f9fee.json" for s in (3, 4, 5)),
         *(f"2026-12-06-h100x1-deepspeed-loss-b64-mps-seed{s}-02aeef1.json" for s in range(6, 12)),
         *(f"2026-12-07-h100x1-deepspeed-loss-b64-mps-seed{s}-dd2f334.json" for s in (12, 13, 14)),
         *(f"2026-12-07-h100x1-deepspeed-loss-b64-mps-seed{s}-d3af8f8.json" for s in (15, 24, 25, 26, 27, 28)),
         *(f"2026-12-07-h100x1-deepspeed-loss-b64-mps-seed{s}-1de25a2.json" for s in (*range(16, 24), *range(29, 46))),
         *(f"2026-12-07-h100x1-deepspeed-loss-b64-mps-seed{s}-128839a.json" for s in range(46, 56)),
         *(f"2026-12-06-h100x1-deepspeed-loss-floor-mps-seed{s}-94f9fee.json" for s in (0, 1, 2)),
         # Cut short at the lease's deadline after their DeepSpeed runs, which repeat the b64 files' to the last bit.
         *(f"2026-12-06-h100x1-deepspeed-loss-floor-mps-seed{s}-cut-94f9fee.json" for s in (3, 4, 5)),
         *(f"2026-12-07-h100x1-deepspeed-loss-floor-mps-seed{s}-1de25a2.json" for s in range(3, 8))),
        "deepspeed",
        {"zpccl:8:4": ("DeepSpeed ZeRO-3 + zpccl.deepspeed, int8 weights, int4 gradients in blocks of 64", 0.5),
         "deepspeed-fp32": ("DeepSpeed ZeRO-3, gradients reduced and accumulated in fp32 (noise floor)", None)}),
    Campaign(
        "fsdp2-57m-b64-bf16start", "57M FSDP2 model as fsdp2-57m-b64, every run started from the weights rounded to "
        "bf16 as DeepSpeed's bf16 mode starts its master copy (fsdp_step.py --start-from-bf16; net-on1gpu-mps)",
        tuple(f"2026-12-06-h100x1-fsdp-loss-b64-bf16start-mps-seed{s}-960e181.json" for s in (0, 1, 2)),
        "nccl",
        {"zpccl:8:4": ("zpccl int8 weights, int4 gradients in blocks of 64, from bf16 weights", 0.5)}),
    Campaign(
        "deepspeed-small-cpu-b64", "2-layer d 128 GPT under DeepSpeed ZeRO-3 (its CPU accelerator, gloo), 2 ranks as 2 "
        "nodes (host backend), 300 steps, cosine decay (deepspeed_step.py --cpu); int8 weights, int4 gradients in "
        "blocks of 64",
        ("2026-12-06-cpu-deepspeed-loss-b64-small-7ffd34d.json",
         "2026-12-06-cpu-deepspeed-loss-b64-small-seeds345-7ffd34d.json"),
        "deepspeed",
        {"zpccl:8:4": ("DeepSpeed ZeRO-3 + zpccl.deepspeed", 0.5)}),
    Campaign(
        "fsdp2-small-cpu-b64", "the same GPT, data and schedule under FSDP2 (gloo), the same formats "
        "(fsdp_step.py --cpu)",
        ("2026-12-06-cpu-fsdp-loss-b64-small-7ffd34d.json", "2026-12-06-cpu-fsdp-loss-b64-small-seeds345-7ffd34d.json"),
        "nccl",
        {"zpccl:8:4": ("FSDP2 + zpccl.fsdp", 0.5)}),
    Campaign(
        "grad-cpu", "2-layer d 128 GPT, 4 thread-ranks as 2 nodes of 2 (host backend), 600 steps (grad_numerics.py "
        "--cpu); weights exact",
        ("2026-12-03-cpu-threads-grad-numerics-6e43048.json",
         "2026-12-03-cpu-threads-grad-numerics-b32-b64sr-9177042.json",
         "2026-12-03-cpu-threads-grad-numerics-int8-b64-2ed87f4.json",
         "2026-12-03-cpu-threads-grad-numerics-seeds23-b382d1a.json",
         "2026-12-03-cpu-threads-grad-numerics-sr-ef-seeds23-3d2dce1.json",
         "2026-12-04-cpu-threads-grad-numerics-b32-seeds23-5594eac.json"),
        "exact",
        {"exact-fp32": ("FSDP's, fp32 reduction (noise floor)", None),
         "int4": ("int4, nearest, blocks of 256", 0.1),
         "int4-sr": ("int4, stochastic rounding, 256", 0.1),
         "int4-ef": ("int4, error feedback, 256", 0.1),
         "int4-sr-ef": ("int4, SR + EF, 256", 0.1),
         "int4-b64": ("int4, nearest, blocks of 64", 0.1),
         "int4-b64-sr": ("int4, stochastic rounding, 64", 0.1),
         "int4-b32": ("int4, nearest, blocks of 32", 0.1),
         "int8": ("int8, nearest, 256", 0.1)},
        (("int4-b64", "int4"), ("int4-b32", "int4"), ("int4-sr", "int4"), ("int4-ef", "int4"))),
    Campaign(
        "grad-gpu", "the same runs on one H200 (4 processes as 2 nodes of 2, CUDA kernels); weights exact",
        ("2026-12-04-h200x1-grad-numerics-seed0-b6e1f2a.json", "2026-12-04-h200x1-grad-numerics-seed1-b6e1f2a.json",
         "2026-12-04-h200x1-grad-numerics-b32-b6e1f2a.json"),
        "exact",
        {"int4": ("int4, nearest, blocks of 256", 0.1),
         "int4-b64": ("int4, nearest, blocks of 64", 0.1),
         "int4-b32": ("int4, nearest, blocks of 32", 0.1)},
        (("int4-b64", "int4"), ("int4-b32", "int4"))),
    Campaign(
        "grad-gpu-w8", "the same on one H200 with int8 weights (qwZ) in every zpccl run",
        ("2026-12-03-h200x1-grad-numerics-root-1bf77a3.json",),
        "exact",
        {"exact-fp32": ("FSDP's, fp32 reduction (noise floor)", None),
         "int4": ("int8 weights, int4 gradients, 256", 0.1),
         "int4-sr": ("int8 weights, int4 SR gradients, 256", 0.1)}),
)

#: Loss files no campaign takes, and why (``--check`` fails on any other file that is left out).
NOT_PAIRED = {
    "2026-12-06-cpu-deepspeed-loss-curve-57m-9ec8a6d.json": "DeepSpeed's exact curve, read beside FSDP2's "
    "(perf/notebook/accuracy.md): no zpccl run",
    "2026-12-06-cpu-fsdp-loss-curve-57m-9ec8a6d.json": "FSDP2's exact curve, read beside DeepSpeed's: no zpccl run",
    "2026-12-02-h200x1-fsdp-loss-runs-net-on1gpu.json": "its rows name no seed",
    **{f"2026-12-06-h100x1-{name}-960e181.json": f"{what}: the first 12 steps of the 400-step schedule, every "
       "step's loss (--loss-stop 12), read beside each other (perf/notebook/accuracy.md): no zpccl run"
       for name, what in (("deepspeed-loss-curve-57m-mps", "DeepSpeed's exact curve"),
                          ("fsdp-loss-curve-57m-mps", "FSDP2's exact curve"),
                          ("fsdp-loss-curve-57m-bf16start-mps", "FSDP2's exact curve from the weights rounded to "
                                                                "bf16"))},
    **{f"2026-12-06-h100x1-deepspeed-loss-repeat-mps-seed{s}-960e181.json": "deepspeed repeating 185ef4b's runs "
       "to the last bit (DeepSpeed's runs are deterministic); its deepspeed-fp32, from before 9f121d9, rounded as "
       "deepspeed does and repeats it too, so it is no noise floor" for s in (0, 1, 2)},
    "2026-12-03-h200x1-grad-numerics-seed0-35f8470.json": "stochastic rounding's numerics changed after 35f8470 "
    "(its int4-sr seed 0 differs from 1bf77a3's); its other rows are in grad-gpu-w8",
    "2026-12-03-h200x1-grad-numerics-seed0-ef-35f8470.json": "numerics of 35f8470's error feedback, one seed, "
    "no baseline run in the file",
}


@dataclass(frozen=True)
class Row:
    """One configuration's statistics within its campaign."""

    campaign: str
    config: str
    label: str
    reference: str
    tolerance: float | None
    stats: GapStats
    files: tuple[str, ...] = ()  #: the files of the paired runs, in the campaign's order
    unpaired: tuple[int, ...] = ()  #: seeds of ``config`` with no ``reference`` run

    def as_dict(self) -> dict[str, Any]:
        s = self.stats
        return dict(campaign=self.campaign, config=self.config, label=self.label, reference=self.reference,
                    seeds=s.seeds, gaps_pct={str(k): v for k, v in s.gaps.items()}, n=s.n, mean_pct=s.mean,
                    sd_pct=s.sd, se_pct=s.se, t=s.t, level=s.level, ci_pct=None if s.lo is None else [s.lo, s.hi],
                    bound_pct=s.bound, sign=s.sign, tolerance_pct=self.tolerance,
                    verdict=None if self.tolerance is None else verdict(s, self.tolerance))


def campaign_rows(c: Campaign, results: pathlib.Path = RESULTS, load: Callable[[str], Any] | None = None) -> list[Row]:
    """Every configuration of the campaign that has a seed in common with its baseline, in the campaign's order
    (then any other configuration found, in file order), then the campaign's contrasts. ``load`` reads a file by
    name (default: JSON from ``results``)."""
    read = load or (lambda name: json.loads((results / name).read_text()))
    def named_runs(name: str) -> list[Run]:  # a file's runs under their names in this campaign
        doc = read(name)
        return [replace(r, config=c.config_of(doc, r.config)) for r in runs_of_doc(doc, name)]

    table = merge_runs(r for f in c.files for r in named_runs(f))
    if c.reference not in table:
        raise ValueError(f"campaign {c.name}: no {c.reference!r} run in {', '.join(c.files)}")

    def row(config: str, against: str, label: str, tolerance: float | None) -> Row | None:
        mine, theirs = table[config], table[against]
        gaps = paired_gaps({s: r.valid for s, r in mine.items()}, {s: r.valid for s, r in theirs.items()})
        if not gaps:
            return None
        used = {mine[s].file for s in gaps} | {theirs[s].file for s in gaps}
        return Row(c.name, config, label, against, tolerance, gap_stats(gaps), tuple(f for f in c.files if f in used),
                   tuple(s for s in sorted(mine) if s not in theirs))

    order = list(c.configs) + [k for k in table if k not in c.configs and k != c.reference]
    rows = []
    for config in order:
        if config in table:
            label, tolerance = c.configs.get(config, (config, None))
            rows.append(row(config, c.reference, label, tolerance))
    for config, against in c.contrasts:
        for name in (config, against):
            if name not in table:
                raise ValueError(f"campaign {c.name}: contrast {config} against {against}: no {name!r} run")
        label = f"{c.configs.get(config, (config,))[0]}, against {c.configs.get(against, (against,))[0]}"
        rows.append(row(config, against, label, None))
    return [r for r in rows if r is not None]


def campaign(name: str) -> Campaign:
    """The campaign of :data:`CAMPAIGNS` called ``name``."""
    for c in CAMPAIGNS:
        if c.name == name:
            return c
    raise ValueError(f"no loss campaign {name!r} (known: {', '.join(c.name for c in CAMPAIGNS)})")


# ---- output ---------------------------------------------------------------------------------------------------


def _pct(x: float | None, signed: bool = True) -> str:
    """Two decimals, three under 0.01 (so that a mean of +0.004 does not read +0.00)."""
    if x is None:
        return ""
    digits = 3 if 0 < abs(x) < 0.01 else 2
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def describe(row: Row) -> str:
    """What the interval supports, in words: the verdict at the row's tolerance, and the sign where the interval
    resolves one (the interval itself is beside it in every table)."""
    s = row.stats
    if s.lo is None:
        return "one seed: no interval"
    words = [verdict(s, row.tolerance)] if row.tolerance is not None else []
    if s.sign != "none" and not (words and words[0].startswith(("more than", "below"))):  # those say the sign
        words.append(f"{s.sign} `{row.reference}`")
    return "; ".join(words) or "no difference resolved"


def gap_cells(stats: GapStats) -> list[str]:
    """A row's cells: seeds, mean gap (%), standard error, 95% interval and the gap of each seed."""
    ci = "-" if stats.lo is None else f"{stats.lo:+.2f} .. {stats.hi:+.2f}%"
    se = "-" if stats.se is None else _pct(stats.se, False)
    per_seed = " / ".join(f"{stats.gaps[s]:+.2f}" for s in stats.seeds)
    return [",".join(str(x) for x in stats.seeds), f"{_pct(stats.mean)}%", se, ci, per_seed]


def markdown(rows: list[Row], title: str) -> str:
    """One campaign's table: per row, the seeds, the mean gap and its standard error (percent), the interval, the
    gap of each seed and what the interval supports."""
    lines = [f"*{title}*; gaps to `{rows[0].reference}` unless a row names another" if rows else f"*{title}*", "",
             "| configuration | seeds | mean gap | SE | 95% interval | per seed, % | the interval supports |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| " + " | ".join([r.label, *gap_cells(r.stats), describe(r)]) + " |")
    return "\n".join(lines)


def check_coverage(results: pathlib.Path = RESULTS) -> list[str]:
    """Loss files in ``results`` that no campaign reads and :data:`NOT_PAIRED` does not explain."""
    taken = {f for c in CAMPAIGNS for f in c.files} | set(NOT_PAIRED)
    loose = []
    for path in sorted(results.glob("*.json")):
        if ("loss" in path.name or "grad-numerics" in path.name) and path.name not in taken:
            loose.append(path.name)
    return loose


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS), help="the folder of result files")
    p.add_argument("--campaigns", default="", help="comma-separated campaign names (default: all)")
    p.add_argument("--json", default="", help="also write the figures here")
    p.add_argument("--check", action="store_true",
                   help="fail when a loss file in --results belongs to no campaign and is not listed as unpaired")
    a = p.parse_args(argv)
    results = pathlib.Path(a.results)
    names = [n for n in a.campaigns.split(",") if n]
    known = {c.name for c in CAMPAIGNS}
    for n in names:
        if n not in known:
            p.error(f"--campaigns: unknown campaign {n!r} (known: {', '.join(sorted(known))})")
    out = []
    for c in CAMPAIGNS:
        if names and c.name not in names:
            continue
        rows = campaign_rows(c, results)
        print(markdown(rows, c.title), end="\n\n")
        out.extend(r.as_dict() for r in rows)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(dict(level=LEVEL, rows=out), indent=1) + "\n")
    if a.check:
        loose = check_coverage(results)
        if loose:
            print("loss files in no campaign: " + ", ".join(loose), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
