#!/usr/bin/env python3
"""Static SASS statistics of the kernels' tile loops: what a warp issues per tile.

    python kernels/cuda/sass_loop_stats.py NEW [--compare OLD] [--kernel REGEX] [--kp 128]

NEW and OLD are objects or fatbinaries built by nvcc (``cuobjdump -sass`` lists
them; found on $CUOBJDUMP, $PATH or in the CUDA toolkit kernels/build.py finds)
or text files that already hold that listing (``*.sass``, ``*.txt``). Without a
GPU this is how a change to
a kernel's inner loops is weighed: the instructions in the loop a warp runs
once per tile, the branches and global loads among them, and for
``ForwardRegKernel`` an estimate of the instructions a warp issues per 64-class
tile. On the H100 run of 2026-11-26 that estimate agreed with what Nsight
Compute's issue rate implies (kernels/cuda/README.md, the register-softmax
section of 2026-11-27): the loop body is the work there.

For each function that has a loop holding tensor-core products (``HMMA``):

* tile loop: the outermost such loop (a backward branch and its target), all
  instructions between, counted once;
* k-step loop: the innermost such loop (the logits' k loop), and how many k
  steps ptxas unrolled into one pass of it (its ``HMMA`` count over the
  products of one k step: NT = 64 / WC / 8 fragments, three products each in
  3xTF32, one in TF32);
* per tile (ForwardRegKernel only): the tile loop's instructions outside its
  inner loops, plus kp / 8 / unroll passes of the k-step loop, plus the code
  tile's 64 x kp / 4 sixteen-byte copies over the block's threads at the cost
  per copy of the cheapest vector staging loop (LDGSTS.128; the other staging
  loops serve widths and alignments the tile does not have and are left
  out). It overcounts code that does not run on a given tile: the setup of
  the staging paths not taken, the P.M blocks past kp / 8.

Counts are static: nothing here measures time.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)", re.M)
# "        /*6ff0*/                   HMMA.1688.F32.TF32 R96, R100, R126, R96 ;"
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;")
_BACKWARD_TARGET = re.compile(r"\bBRA\s+(?:0x)?([0-9a-f]+)\b")
_PREDICATE = re.compile(r"^@!?U?P(?:T|\d+)\s+")
_REG_KERNEL = re.compile(r"ForwardRegKernelILi(\d+)ELi(\d+)ELi(\d+)E")
_MATH = {1: "3xtf32", 2: "tf32"}  # ecoc_engine.cuh: kMath3xTf32 = 1, kMathTf32 = 2


def full_opcode(text: str) -> str:
    """'@!P4 IMAD.IADD.U32 R1, ...' -> 'IMAD.IADD.U32'."""
    return _PREDICATE.sub("", text).split()[0]


def opcode(text: str) -> str:
    """'@!P4 IMAD.IADD.U32 R1, ...' -> 'IMAD'."""
    return full_opcode(text).split(".")[0]


@dataclass
class Function:
    name: str
    instructions: list = field(default_factory=list)  # (address, text)

    def loops(self) -> list:
        """(target, branch address) of every backward branch."""
        out = []
        for address, text in self.instructions:
            if opcode(text) != "BRA":
                continue
            m = _BACKWARD_TARGET.search(_PREDICATE.sub("", text))
            if m and int(m.group(1), 16) <= address:
                out.append((int(m.group(1), 16), address))
        return out

    def histogram(self, lo: int, hi: int) -> collections.Counter:
        return collections.Counter(opcode(t) for a, t in self.instructions if lo <= a <= hi)

    def vector_copies(self, lo: int, hi: int) -> int:
        """16-byte cp.async (LDGSTS...128) instructions in [lo, hi]."""
        return sum(1 for a, t in self.instructions if lo <= a <= hi
                   and full_opcode(t).startswith("LDGSTS") and ".128" in full_opcode(t))


def parse(listing: str) -> list:
    """The functions of a `cuobjdump -sass` listing, in order."""
    functions = []
    starts = list(_FUNCTION.finditer(listing))
    for i, m in enumerate(starts):
        body = listing[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(listing)]
        f = Function(m.group(1))
        f.instructions = [(int(a, 16), t.strip()) for a, t in _INSTRUCTION.findall(body)]
        functions.append(f)
    return functions


@dataclass
class LoopStats:
    tile: collections.Counter
    kstep: collections.Counter
    unroll: int | None = None        # k steps per pass of the k-step loop
    per_tile: int | None = None      # ForwardRegKernel: estimated instructions per tile
    copy_cost: float | None = None   # instructions per 16-byte copy of the code tile

    @property
    def tile_total(self) -> int:
        return sum(self.tile.values())

    @property
    def kstep_total(self) -> int:
        return sum(self.kstep.values())


def loop_stats(f: Function, kp: int = 128) -> LoopStats | None:
    """Statistics of f's tile loop, None when no loop holds an HMMA."""
    hist = {lp: f.histogram(*lp) for lp in f.loops()}
    size = {lp: sum(h.values()) for lp, h in hist.items()}
    with_mma = [lp for lp, h in hist.items() if h["HMMA"] > 0]
    if not with_mma:
        return None
    outer = max(with_mma, key=lambda lp: lp[1] - lp[0])
    inner = min(with_mma, key=lambda lp: lp[1] - lp[0])
    st = LoopStats(hist[outer], hist[inner])
    m = _REG_KERNEL.search(f.name)
    if m and inner != outer:
        math, bt, nw = (int(g) for g in m.groups())
        warp_splits = nw // (bt // 16)           # RegWarpSplits
        per_step = (64 // warp_splits // 8) * (3 if math == 1 else 1)
        st.unroll = max(1, st.kstep["HMMA"] // per_step)
        # The loops directly inside the tile loop: the k-step loop, kp / 8 /
        # unroll passes; the code tile's vector staging (16-byte cp.async,
        # LDGSTS.128), 64 x kp / 4 copies over the block's threads, through
        # the loop with the fewest instructions per copy (the other vector
        # loop and the scalar one serve widths or alignments this tile does
        # not have); every other inner loop is left out.
        inside = [lp for lp in hist if lp != outer and outer[0] <= lp[0] and lp[1] <= outer[1]]
        nested = [lp for lp in inside
                  if not any(o != lp and o[0] <= lp[0] and lp[1] <= o[1] for o in inside)]
        copies = {lp: f.vector_copies(*lp) for lp in nested}
        staging = [lp for lp in nested if copies[lp] and hist[lp]["HMMA"] == 0]
        body = st.tile_total - sum(size[lp] for lp in nested)
        st.per_tile = body + (kp // 8 // st.unroll) * st.kstep_total
        if staging:
            st.copy_cost = min(size[lp] / copies[lp] for lp in staging)
            per_thread = 64 * (kp // 4) // (nw * 32)
            st.per_tile += round(per_thread * st.copy_cost)
    return st


def short_name(mangled: str) -> str:
    """'_ZN...16ForwardRegKernelILi1ELi64ELi4EEEv...' -> 'ForwardRegKernel<3xtf32, 64, 4>'."""
    m = _REG_KERNEL.search(mangled)
    if m:
        math, bt, nw = (int(g) for g in m.groups())
        return f"ForwardRegKernel<{_MATH.get(math, math)}, {bt}, {nw}>"
    m = re.search(r"\d+([A-Z]\w*?Kernel)(?:I(.*?)EE)?(?:Ev|E)", mangled)
    if not m:
        return mangled
    args = re.findall(r"Li(\d+)E|Lb(\d)E", (m.group(2) or "") + "E")
    return m.group(1) + (f"<{', '.join(a or b for a, b in args)}>" if args else "")


def find_cuobjdump() -> str | None:
    """$CUOBJDUMP, else cuobjdump on $PATH, else the one of the CUDA toolkit
    kernels/build.py builds with (its find_cuda); None when there is none."""
    for candidate in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    spec = importlib.util.spec_from_file_location(
        "_ecoc_build", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "build.py"))
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build  # its dataclasses look their module up
    spec.loader.exec_module(build)
    home = build.find_cuda()[1]
    candidate = home and os.path.join(home, "bin", "cuobjdump")
    return candidate if candidate and os.path.isfile(candidate) else None


def read_listing(path: str) -> str:
    if path.endswith((".sass", ".txt")):
        with open(path) as fh:
            return fh.read()
    tool = find_cuobjdump()
    if tool is None:
        raise SystemExit("sass_loop_stats: cuobjdump not found (set CUOBJDUMP, or pass a saved "
                         "`cuobjdump -sass` listing ending in .sass or .txt)")
    return subprocess.run([tool, "-sass", path], check=True, capture_output=True,
                          text=True).stdout


def collect(path: str, kernel: str, kp: int) -> dict:
    """{short name: LoopStats} of the matching functions with an HMMA loop."""
    pattern = re.compile(kernel)
    out = {}
    for f in parse(read_listing(path)):
        if not pattern.search(f.name):
            continue
        st = loop_stats(f, kp)
        if st is not None:
            out[short_name(f.name)] = st
    return out


def _cell(old, new, fmt="{:,}") -> str:
    if new is None:
        return "-"
    if old is None:
        return fmt.format(new)
    if old == new or not old:
        return f"{fmt.format(old)} → {fmt.format(new)}"
    return f"{fmt.format(old)} → {fmt.format(new)} ({100.0 * (new / old - 1):+.0f} %)"


def table(new: dict, old: dict | None, kp: int) -> str:
    head = ("| kernel | tile loop | k-step loop (unroll) | per tile, kp = "
            f"{kp} | HMMA in tile loop | branches | global loads |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for name, st in new.items():
        o = (old or {}).get(name)
        ks = f"{st.kstep_total}" + (f" (×{st.unroll})" if st.unroll else "")
        if o is not None:
            ks = f"{o.kstep_total} → {ks}"
        lines.append(
            f"| {name} | {_cell(o and o.tile_total, st.tile_total)} | {ks} | "
            f"{_cell(o and o.per_tile, st.per_tile)} | "
            f"{_cell(o and o.tile['HMMA'], st.tile['HMMA'])} | "
            f"{_cell(o and o.tile['BRA'], st.tile['BRA'])} | "
            f"{_cell(o and o.tile['LDG'], st.tile['LDG'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("new", help="object / fatbinary, or a saved cuobjdump -sass listing")
    p.add_argument("--compare", metavar="OLD", help="the same, before the change")
    p.add_argument("--kernel", default="ForwardRegKernel",
                   help="regular expression on the mangled names (default: ForwardRegKernel)")
    p.add_argument("--kp", type=int, default=128,
                   help="padded code length for the per-tile estimate (multiple of 8, <= 128)")
    args = p.parse_args(argv)
    if args.kp <= 0 or args.kp % 8 or args.kp > 128:
        p.error(f"--kp must be a multiple of 8 in [8, 128]. Received: --kp={args.kp}")
    new = collect(args.new, args.kernel, args.kp)
    if not new:
        print(f"no function matching {args.kernel!r} has a loop with HMMA", file=sys.stderr)
        return 1
    old = collect(args.compare, args.kernel, args.kp) if args.compare else None
    print(table(new, old, args.kp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
