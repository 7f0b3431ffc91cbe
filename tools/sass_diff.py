#!/usr/bin/env python3
"""Whether two builds run the same GPU code: the SASS of every kernel, compared function by function.

    python3 tools/sass_diff.py dump build /tmp/sass-before      # cuobjdump -sass of a build's binaries
    python3 tools/sass_diff.py compare /tmp/sass-before build   # each side: a build folder or a dump folder

A change that only moves code between files, renames helpers or edits comments leaves every kernel's machine
code as it was; this says whether it did, on a machine without a GPU (nvcc compiles for any architecture).
tools/sass-diff.sh builds two commits and runs both steps.

What is compared: for each binary (libzpccl.so and the test binaries by default), each architecture's SASS of
each function, keyed by its demangled name with ``(anonymous namespace)::`` dropped (the mangled name of an
anonymous namespace carries a hash of its file's name, so a kernel moved to another file keeps its key). The
text compared is every instruction with its encoding; branch and call targets are offsets inside the function,
so a function's place in the binary does not matter. Prints one line per binary (functions, identical,
differing, only on one side), the differing functions' names and the start of each one's difference; exits 1
when anything differs or is on one side only, 0 when every function is identical.
"""
from __future__ import annotations

import argparse
import difflib
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections import defaultdict

# The binaries of a build that hold the device kernels (the perf binaries and tools link the same objects).
DEFAULT_BINARIES = ("libzpccl.so", "tests/zpccl_host_tests", "tests/zpccl_gpu_tests")
ANON = "(anonymous namespace)::"


def find_cuobjdump() -> str:
    """$CUOBJDUMP, else cuobjdump on PATH, else beside nvcc."""
    explicit = os.environ.get("CUOBJDUMP")
    if explicit:
        return explicit
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    if nvcc and (pathlib.Path(nvcc).parent / "cuobjdump").exists():
        return str(pathlib.Path(nvcc).parent / "cuobjdump")
    sys.exit("sass_diff: cuobjdump not found: put the CUDA toolkit's bin on PATH or set CUOBJDUMP "
             "(pip install nvidia-cuda-cuobjdump provides one)")


def dump_binary(cuobjdump: str, binary: pathlib.Path) -> str:
    result = subprocess.run([cuobjdump, "-sass", str(binary)], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"sass_diff: {cuobjdump} -sass {binary} failed: {result.stderr.strip()}")
    return result.stdout


def parse(text: str) -> dict[tuple[str, str], list[str]]:
    """(architecture, mangled name) -> instruction lines, for every function of a cuobjdump -sass listing."""
    functions: dict[tuple[str, str], list[str]] = {}
    arch = "?"
    body: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("code for sm_"):
            arch = stripped.split()[-1]
            body = None
        elif stripped.startswith("Function : "):
            name = stripped[len("Function : "):]
            key = (arch, name)
            if key in functions:  # the same function from two objects (a weak template): compare the first
                body = None
            else:
                body = functions[key] = []
        elif stripped.startswith("Fatbin "):
            body = None
        elif body is not None and stripped and not stripped.startswith("....."):
            # "/*0040*/  INSTR ;  /* encoding */" and continuation lines "/* encoding */": drop the address (the
            # listing's own numbering) and the padding (its width follows the listing's longest line), keep the
            # instruction and its encoding.
            body.append(re.sub(r"\s+", " ", re.sub(r"^/\*[0-9a-f]{4,}\*/\s*", "", stripped)))
    return functions


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt") or shutil.which("llvm-cxxfilt")
    if tool is None:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def keyed(functions: dict[tuple[str, str], list[str]]) -> dict[tuple[str, str], list[str]]:
    """The same functions under (architecture, demangled name without anonymous namespaces)."""
    names = demangle(sorted({name for _, name in functions}))
    out: dict[tuple[str, str], list[str]] = {}
    for (arch, name), body in functions.items():
        out[(arch, names[name].replace(ANON, ""))] = body
    return out


def side_texts(side: pathlib.Path, binaries: list[str], cuobjdump: str | None) -> dict[str, str]:
    """binary name -> SASS listing: read from a dump folder (NAME.sass) or dumped from a build folder."""
    texts = {}
    for name in binaries:
        saved = side / (name.replace("/", "_") + ".sass")
        if saved.exists():
            texts[name] = saved.read_text()
        elif (side / name).exists():
            texts[name] = dump_binary(cuobjdump or find_cuobjdump(), side / name)
        else:
            sys.exit(f"sass_diff: neither {saved} nor {side / name} exists")
    return texts


def cmd_dump(args: argparse.Namespace) -> int:
    cuobjdump = find_cuobjdump()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.binary:
        text = dump_binary(cuobjdump, pathlib.Path(args.build) / name)
        (out / (name.replace("/", "_") + ".sass")).write_text(text)
        print(f"{name}: {len(parse(text))} functions -> {out / (name.replace('/', '_') + '.sass')}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    cuobjdump = None
    a_texts = side_texts(pathlib.Path(args.a), args.binary, cuobjdump)
    b_texts = side_texts(pathlib.Path(args.b), args.binary, cuobjdump)
    bad = 0
    for name in args.binary:
        a, b = keyed(parse(a_texts[name])), keyed(parse(b_texts[name]))
        arches = sorted({arch for arch, _ in a} | {arch for arch, _ in b})
        same = [k for k in a if k in b and a[k] == b[k]]
        differ = sorted(k for k in a if k in b and a[k] != b[k])
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        per_arch: dict[str, int] = defaultdict(int)
        for arch, _ in same:
            per_arch[arch] += 1
        print(f"{name}: {len(set(a) | set(b))} functions ({', '.join(arches)}): {len(same)} identical "
              f"({', '.join(f'{arch} {per_arch[arch]}' for arch in arches)}), {len(differ)} differ, "
              f"{len(only_a)} only in {args.a}, {len(only_b)} only in {args.b}")
        for arch, fn in differ:
            print(f"  differs [{arch}]: {fn}")
            diff = list(difflib.unified_diff(a[(arch, fn)], b[(arch, fn)], lineterm="", n=1))
            for line in diff[2:2 + args.context]:
                print(f"    {line}")
        for arch, fn in only_a:
            print(f"  only in {args.a} [{arch}]: {fn}")
        for arch, fn in only_b:
            print(f"  only in {args.b} [{arch}]: {fn}")
        bad += len(differ) + len(only_a) + len(only_b)
    print("every function identical" if bad == 0 else f"{bad} functions differ or are on one side only")
    return 0 if bad == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    dump = sub.add_parser("dump", help="save cuobjdump -sass of a build's binaries")
    dump.add_argument("build", help="build folder")
    dump.add_argument("out", help="folder for the listings (NAME.sass)")
    compare = sub.add_parser("compare", help="compare two builds or dumps function by function")
    compare.add_argument("a", help="build folder or dump folder")
    compare.add_argument("b", help="build folder or dump folder")
    compare.add_argument("--context", type=int, default=12, help="diff lines shown per differing function")
    for p in (dump, compare):
        p.add_argument("--binary", action="append", default=None,
                       help=f"binary to compare, relative to the build folder (default: {', '.join(DEFAULT_BINARIES)})")
    args = parser.parse_args()
    args.binary = args.binary or list(DEFAULT_BINARIES)
    return cmd_dump(args) if args.command == "dump" else cmd_compare(args)


if __name__ == "__main__":
    sys.exit(main())
