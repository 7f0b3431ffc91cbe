#!/usr/bin/env python3
"""Registers, spills and stack of every device/ kernel, as the compiler reports them (ptxas -v).

    python3 tools/kernel_resources.py build              # one row per kernel template and architecture
    python3 tools/kernel_resources.py build --all        # one row per instantiation
    python3 tools/kernel_resources.py build --markdown   # the rows as perf/KERNELS.md's table
    python3 tools/kernel_resources.py build --all --spills --arch sm_90   # the instantiations that spill on sm_90

Compiles each CUDA file of device/ again with the exact command of the build folder's compile_commands.json
(so with its -Dgpu_archs and flags), adding ``-Xptxas -v`` and writing the object to a temporary folder, and reads
ptxas's report of each entry function: registers a thread, bytes of spill stores and loads, stack frame. These are
compiler facts: they change with the compiler and the code, so they live in perf/KERNELS.md with this command,
not in comments. A row over several instantiations gives the least and the most of each figure.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
from collections import defaultdict

import sass_diff  # tools/sass_diff.py, beside this script

ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+)'")
PROPS = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")


def device_commands(build: pathlib.Path) -> list[tuple[str, list[str], str]]:
    """(source, command, directory) of every device/*.cu in the build's compile_commands.json."""
    entries = json.loads((build / "compile_commands.json").read_text())
    out = []
    for e in entries:
        source = e["file"]
        if re.search(r"(^|/)device/[^/]+\.cu$", source):
            out.append((source, shlex.split(e["command"]), e["directory"]))
    if not out:
        sys.exit(f"kernel_resources: no device/*.cu in {build / 'compile_commands.json'}")
    return out


def resource_command(command: list[str], obj: str) -> list[str]:
    """The compile command without its depfile, writing `obj`, with ptxas's report."""
    out, skip = [], 0
    for i, arg in enumerate(command):
        if skip:
            skip -= 1
            continue
        if arg in ("-MT", "-MF"):
            skip = 1
        elif arg == "-MD":
            pass
        elif arg == "-o":
            out += ["-o", obj]
            skip = 1
        else:
            out.append(arg)
    return out + ["-Xptxas", "-v"]


def parse(report: str) -> dict[tuple[str, str], dict[str, int]]:
    """(architecture, mangled entry name) -> registers, spill_stores, spill_loads, stack."""
    kernels: dict[tuple[str, str], dict[str, int]] = {}
    entry: tuple[str, str] | None = None
    props: str | None = None
    for line in report.splitlines():
        if m := ENTRY.search(line):
            entry = (m.group(2), m.group(1))
            kernels[entry] = {}
        elif m := PROPS.search(line):
            props = m.group(1)
        elif (m := FRAME.search(line)) and entry and props == entry[1]:
            kernels[entry].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif (m := USED.search(line)) and entry:
            kernels[entry]["registers"] = int(m.group(1))
            entry = None
    return kernels


def demangle(names: list[str]) -> dict[str, str]:
    """Demangled names (sass_diff's), anonymous namespaces dropped."""
    return {n: d.replace(sass_diff.ANON, "") for n, d in sass_diff.demangle(names).items()}


def template_of(demangled: str) -> str:
    """`void zp::quantizeWarpKernel<zp::Fp16Type, 8, 0, true>(zp::QuantArgs)` -> `quantizeWarpKernel`."""
    head = demangled.split("<", 1)[0].split("(", 1)[0]
    return head.split("::")[-1].split()[-1]


def span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo} - {hi}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", help="a configured build folder (its compile_commands.json)")
    parser.add_argument("--all", action="store_true", help="one row per instantiation")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument("--spills", action="store_true", help="only rows where some instantiation spills")
    parser.add_argument("--arch", help="only this architecture (e.g. sm_90)")
    args = parser.parse_args()

    kernels: dict[tuple[str, str], dict[str, int]] = {}
    source_of: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for source, command, directory in device_commands(pathlib.Path(args.build).resolve()):
            name = pathlib.Path(source).name
            print(f"## kernel_resources: compiling {name} with -Xptxas -v", file=sys.stderr)
            result = subprocess.run(resource_command(command, str(pathlib.Path(tmp) / (name + ".o"))), cwd=directory,
                                    capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit(f"kernel_resources: compiling {source} failed:\n{result.stderr[-2000:]}")
            found = parse(result.stdout + result.stderr)
            kernels.update(found)
            for _, mangled in found:
                source_of[mangled] = name
    names = demangle(sorted({n for _, n in kernels}))

    rows: dict[tuple[str, str, str], list[dict[str, int]]] = defaultdict(list)
    for (arch, mangled), facts in kernels.items():
        if args.arch and arch != args.arch:
            continue
        label = names[mangled] if args.all else template_of(names[mangled])
        rows[(source_of[mangled], label, arch)].append(facts)
    header = ["file", "kernel" if not args.all else "instantiation", "arch", "count", "registers", "spill stores (B)",
              "spill loads (B)", "stack (B)"]
    lines = []
    for (source, label, arch), facts in sorted(rows.items()):
        if args.spills and not any(f["spill_stores"] or f["spill_loads"] for f in facts):
            continue
        lines.append([source, label, arch, str(len(facts)), span([f["registers"] for f in facts]),
                      span([f["spill_stores"] for f in facts]), span([f["spill_loads"] for f in facts]),
                      span([f["stack"] for f in facts])])
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(f"`{c}`" if i == 1 else c for i, c in enumerate(line)) + " |")
    else:
        widths = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]
        for line in [header] + lines:
            print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
