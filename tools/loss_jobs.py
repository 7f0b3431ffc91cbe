#!/usr/bin/env python3
"""Loss runs of one step script over many seeds, one job a seed, several jobs side by side.

    python3 tools/loss_jobs.py --seeds 3-14 --jobs 6 --out /root/r --name deepspeed-loss-b64 -- \\
        perf/deepspeed_step.py --nproc 2 --nodes 2 --loss-only --loss-steps 400 --grad-block-size 64 \\
        --loss-runs deepspeed,zpccl:8:4
    bash tools/with-mps.sh python3 tools/loss_jobs.py ...   # one MPS daemon serves every job's ranks

A loss run of the 57M model leaves most of one GPU idle, and its seeds are independent: run side by side under one
MPS daemon they train many seeds in the time of a few, and the losses do not depend on the timing. Each seed of
``--seeds`` is a job: the step script after ``--`` (perf/fsdp_step.py, ddp_step.py or deepspeed_step.py, run with
this Python) with ``--loss-seeds S -J OUT/NAME-seedS.json``, its output in ``OUT/NAME-seedS.log``. At most
``--jobs`` run at once, seeds starting in order as others end, ``--stagger`` seconds apart. A job runs at most
``--timeout`` seconds. The first ``--jobs`` jobs start whatever their stagger (their timeout counted from the run's
start must fit before ``--deadline``, seconds from the start); a later job starts only while its whole timeout is left
before the deadline, and the seeds left out are said when they are. At the deadline the jobs still running are
stopped (a GPU call has a time limit; the step scripts rewrite ``-J`` after every loss run, so a job cut short keeps
the runs it finished). A job is stopped with its whole process group (the script's ranks with it). Under MPS a job
stopped inside a kernel can take the jobs beside it down with it (an illegal-address error in their ranks): give
``--timeout`` room enough for the jobs to end on their own.

The report ends with one line a seed: done, failed (exit status), timed out, stopped at the deadline or not started;
its wall seconds; and the loss runs its file holds. Then the paired gaps of every run to the reference run of the
same seed, with their interval (tools/loss_stats.py; the reference is the first run the script lists, as the step
scripts' own summaries take it), over the jobs' files and, with ``--campaign NAME``, that campaign's files in
perf/results/ too, its reference and tolerances: what the seeds so far support, read where they were trained.
Exit status 0 when every seed is done, 1 otherwise.
``--pack FILE.tgz`` then packs OUT into one archive (a GPU call brings back at most eight files; CONTRIBUTING.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import tarfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # tools/: loss_stats
import loss_stats as ls  # noqa: E402
from loss_stats import parse_seeds  # noqa: E402

GRACE_S = 10  # after SIGTERM, how long a stopped job's processes get before SIGKILL


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                usage="%(prog)s --seeds SEEDS --out DIR --name NAME [options] -- SCRIPT [ARG ...]")
    p.add_argument("--seeds", required=True, help="seeds and ranges of seeds, comma-separated: 0,1,2 or 3-14")
    p.add_argument("--jobs", type=int, default=4, help="jobs running at once")
    p.add_argument("--out", required=True, help="the folder of the jobs' result files and logs (made if missing)")
    p.add_argument("--name", required=True, help="the files' stem: NAME-seedS.json and NAME-seedS.log")
    p.add_argument("--timeout", type=float, default=0, help="seconds a job may run (0: no limit)")
    p.add_argument("--deadline", type=float, default=0,
                   help="seconds from the start at which running jobs are stopped; a job starts only while its "
                        "--timeout fits before it (0: no deadline)")
    p.add_argument("--stagger", type=float, default=2, help="seconds between two jobs' starts")
    p.add_argument("--pack", default="", help="then pack --out into this .tgz")
    p.add_argument("--campaign", default="",
                   help="pool the gaps with this loss campaign's files (tools/loss_stats.py) and take its reference "
                        "and tolerances")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARG ...]: the step script and its arguments")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the step script and its arguments after --")
    for flag in ("--loss-seeds", "-J", "--json"):
        if flag in command:
            p.error(f"{flag} is this tool's to set, a job a seed: leave it out of the script's arguments")
    try:
        args.seed_list = parse_seeds(args.seeds)
    except ValueError as e:
        p.error(f"--seeds {args.seeds}: {e}")
    if args.jobs < 1 or args.timeout < 0 or args.deadline < 0 or args.stagger < 0:
        p.error("--jobs must be at least 1, --timeout, --deadline and --stagger at least 0")
    if args.deadline and args.timeout > args.deadline:
        p.error(f"--timeout {args.timeout:g} must not exceed --deadline {args.deadline:g}: no job would fit")
    if "/" in args.name or not args.name:
        p.error(f"--name {args.name!r}: a file stem, without a folder")
    if args.campaign:
        try:
            ls.campaign(args.campaign)
        except ValueError as e:
            p.error(f"--campaign: {e}")
    taken = [f"{args.name}-seed{seed}.{ext}" for seed in args.seed_list for ext in ("json", "log")
             if (pathlib.Path(args.out) / f"{args.name}-seed{seed}.{ext}").exists()]
    if taken:
        p.error(f"{args.out} already holds {', '.join(taken[:4])}{' ...' if len(taken) > 4 else ''}: a job's files "
                "are its own; choose another --name or --out")
    args.command = command
    return args


@dataclasses.dataclass
class Job:
    seed: int
    json: pathlib.Path
    log: pathlib.Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float = 0.0
    status: str = "not started"

    def start(self, command: list[str]) -> None:
        env = dict(os.environ)
        env.pop("RANK", None)  # not one rank of a launched world: the script spawns its ranks
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, *command, "--loss-seeds", str(self.seed), "-J",
                                          str(self.json)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.started = time.monotonic()
        self.status = "running"

    def stop(self, status: str) -> None:
        """Stops the job's process group: SIGTERM, then SIGKILL after GRACE_S."""
        assert self.proc is not None
        for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, None)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc.wait()
        self.ended, self.status = time.monotonic(), status

    def poll(self) -> bool:
        """True once the job has ended on its own."""
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is None:
            return False
        self.ended = time.monotonic()
        self.status = "done" if rc == 0 else f"failed (exit status {rc})"
        # The ranks are the script's children: none may outlive it.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

    def doc(self) -> Any:
        """The job's result file, parsed; None while it has none (or a partial write)."""
        try:
            return json.loads(self.json.read_text())
        except (OSError, ValueError):
            return None

    def runs(self) -> list[str]:
        """The loss runs the job's file holds, "spec@seed" each."""
        doc = self.doc() or {}
        return [f"{r.get('spec')}@{r.get('seed')}" for r in doc.get("losses") or [] if isinstance(r, dict)]


def say_now(text: str) -> None:
    print(text, flush=True)  # a GPU call's output is a pipe: progress shows as it happens


def run(args: argparse.Namespace, say: Any = say_now) -> list[Job]:
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [Job(s, out / f"{args.name}-seed{s}.json", out / f"{args.name}-seed{s}.log") for s in args.seed_list]
    waiting, running = list(jobs), []
    t0 = time.monotonic()
    last_start = -args.stagger
    try:
        while waiting or running:
            now = time.monotonic()
            past_deadline = bool(args.deadline) and now - t0 >= args.deadline
            # The first wave starts whatever its stagger (parse_args keeps its timeout within the deadline): the
            # stagger only keeps the ranks' starts apart.
            first_wave = len(jobs) - len(waiting) < args.jobs
            for job in list(running):
                if job.poll():
                    pass
                elif past_deadline:
                    job.stop("stopped at the deadline")
                elif args.timeout and now - job.started >= args.timeout:
                    job.stop(f"timed out after {args.timeout:g} s")
                else:
                    continue
                running.remove(job)
                say(f"loss_jobs: seed {job.seed}: {job.status} ({job.ended - job.started:.0f} s)")
            late = not first_wave and args.deadline and now - t0 + args.timeout > args.deadline
            if waiting and (past_deadline or late):
                left = max(0.0, args.deadline - (now - t0))
                seeds = ", ".join(str(j.seed) for j in waiting)
                why = (f"the --deadline ({args.deadline:g} s) came first" if past_deadline else
                       f"a job's --timeout ({args.timeout:g} s) no longer fits in the {left:.0f} s left before "
                       "--deadline")
                say(f"loss_jobs: seed{'s' if len(waiting) > 1 else ''} {seeds} not started: {why}")
                waiting.clear()
            elif waiting and len(running) < args.jobs and now - last_start >= args.stagger:
                job = waiting.pop(0)
                job.start(args.command)
                running.append(job)
                last_start = now
                say(f"loss_jobs: seed {job.seed}: started ({job.log})")
                continue
            time.sleep(0.2)
    finally:
        for job in running:  # interrupted: leave no job behind
            job.stop("stopped (interrupted)")
    return jobs


def report(jobs: list[Job]) -> list[str]:
    lines = []
    for job in jobs:
        wall = f"{job.ended - job.started:.0f} s" if job.started else "-"
        runs = job.runs()
        lines.append(f"seed {job.seed}: {job.status}, {wall}, "
                     f"{', '.join(runs) if runs else 'no loss run in ' + job.json.name}")
    done = sum(j.status == "done" for j in jobs)
    lines.append(f"{done} of {len(jobs)} seeds done")
    return lines


def gap_table(jobs: list[Job], campaign: str = "") -> str:
    """The paired gaps over the jobs' files (and ``campaign``'s), as tools/loss_stats.py's Markdown table; a line
    saying why where there are none."""
    docs = {j.json.name: doc for j in jobs if (doc := j.doc()) and doc.get("losses")}
    if not docs:
        return "no loss run finished: no gaps"
    title = f"{len(docs)} job files" + (f" and campaign {campaign}" if campaign else "")
    if campaign:
        pooled = ls.campaign(campaign)
        c = dataclasses.replace(pooled, name="loss_jobs", title=title, files=pooled.files + tuple(docs))
    else:
        c = ls.Campaign("loss_jobs", title, tuple(docs), docs[next(iter(docs))]["losses"][0]["spec"])
    reference = c.reference
    try:
        rows = ls.campaign_rows(c, load=lambda name: docs[name] if name in docs else
                                json.loads((ls.RESULTS / name).read_text()))
    except ValueError as e:
        return f"no gaps: {e}"
    return ls.markdown(rows, c.title) if rows else f"no run shares a seed with {reference!r}: no gaps"


def pack(folder: pathlib.Path, archive: pathlib.Path) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(folder.iterdir()):
            if path.resolve() != archive.resolve():
                tar.add(path, arcname=path.name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = run(args)
    for line in report(jobs):
        print(line)
    print(gap_table(jobs, args.campaign))
    if args.pack:
        pack(pathlib.Path(args.out), pathlib.Path(args.pack))
        print(f"loss_jobs: packed {args.out} into {args.pack}")
    return 0 if all(j.status == "done" for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
