#!/usr/bin/env python3
"""Static SASS statistics of the kernels' tile loops: what a warp issues per tile.

    python kernels/cuda/sass_loop_stats.py NEW [--compare OLD] [--kernel REGEX] [--kp 128]
    python kernels/cuda/sass_loop_stats.py NEW.cubin --by-line [--kernel REGEX] [--top 12]
    python kernels/cuda/sass_loop_stats.py NEW --loads-ahead [--compare OLD] [--kernel REGEX]

NEW and OLD are objects or fatbinaries built by nvcc (``cuobjdump -sass`` lists
them; found on $CUOBJDUMP, $PATH or in the CUDA toolkit kernels/build.py finds)
or text files that already hold that listing (``*.sass``, ``*.txt``). Without a
GPU this is how a change to
a kernel's inner loops is weighed: the instructions in the loop a warp runs
once per tile, the branches and global loads among them, and for
``ForwardRegKernel`` an estimate of the instructions a warp issues per 64-class
tile (for ``CodesGradMmaKernel``, per batch tile). On the H100 run of
2026-11-26 that estimate agreed with what Nsight Compute's issue rate implies
(kernels/cuda/README.md, the register-softmax section of 2026-11-27): the loop
body is the work there.

For each function that has a loop holding tensor-core products (``HMMA``):

* tile loop: the outermost such loop (a backward branch and its target), all
  instructions between, counted once;
* k-step loop: the innermost such loop (the logits' k loop), and how many k
  steps ptxas unrolled into one pass of it (its ``HMMA`` count over the
  products of one k step: NT = 64 / WC / 8 fragments, three products each in
  3xTF32, one in TF32);
* k-step loop per HMMA: its instructions over its tensor-core products,
  for every kernel (the products' overhead: operand loads, TF32 splits,
  addressing);
* per tile (ForwardRegKernel): the tile loop's instructions outside its
  inner loops, plus kp / 8 / unroll passes of the k-step loop, plus the code
  tile's 64 x kp / 4 sixteen-byte copies over the block's threads at the cost
  per copy of the cheapest vector staging loop (LDGSTS.128; the other staging
  loops serve widths and alignments the tile does not have and are left
  out). It overcounts code that does not run on a given tile: the setup of
  the staging paths not taken, the P.M blocks past kp / 8;
* per batch tile (CodesGradMmaKernel): the same for the codes gradient's
  tile loop, whose tile is a batch tile of BT rows against the block's 32
  classes: the body once, the first product's k-step loop kp / 8 / unroll
  times, the u tile's BT x kp / 4 copies at the cheapest vector staging
  loop's cost, the loops run once per block (the first tile's norms) not at
  all, and where ptxas made a `switch` of the unrolled second product (one
  straight-line case per count of the warp's column blocks) each case with
  the share of the 4 warps that take it at kp; kp stops at the
  instantiation's KMAX, as for the forward;
* stall cycles per tile: the stall counts of the same instructions' control
  bits, weighted the same way (static, the k-step loop once, where there is
  no per-tile estimate). ptxas sets them to cover fixed-latency results, a
  tensor-core product's among them: the cycles one warp alone needs per
  tile when no shared or global load keeps it waiting (those wait on
  scoreboards, at run time). Where it is well above the instruction count,
  the warp waits on dependent products, and only other warps on its
  scheduler fill the gaps.

--by-line attributes the same count to source lines: NEW is then a cubin
built with ``-lineinfo`` (``nvcc -cubin -lineinfo ...``; ``nvdisasm -g``
lists it) or a saved ``nvdisasm -g`` listing, and each function gets a table
of its tile loop's instructions per source line (weighted as the per-tile
estimate: the k-step loop's lines by its passes, the staging loop's by its
copies per thread; static counts, the k-step loop once, where a function
has no per-tile estimate). That is how the share of, say, the TF32 operand
splits in a tile was found (kernels/cuda/README.md).

--loads-ahead looks at what the control bits do not show: a shared-memory
load's latency, waited on at run time through a scoreboard. For each
innermost loop with at least 8 shared loads (LDS) of each matching function
(with or without HMMA) it walks the body once and, at every instruction that
reads a loaded register, counts the loads issued and not yet used (that one
included): 1 means each load's latency is exposed unless other warps cover
it. The 64-row split codes gradient's second product went from 6 to 2 on
average with bb86f52 and took 1.35-1.8x longer on the H200 of 2026-11-28
(kernels/cuda/README.md, "Measured on the H200, 2026-11-28"); the stall-cycle
count had gone down.

The tools: $CUOBJDUMP / $NVDISASM, else on $PATH, else the pip wheels
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` (the extra
``keras-ecoc[sass]``; a CUDA toolkit without them, such as this project's
CI image, gets them there), else the CUDA toolkit kernels/build.py finds.

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
# cuobjdump prints each 128-bit instruction as two 64-bit words, the second
# (on the next line) ending in the scheduling control bits.
_CONTROL = re.compile(r"/\*([0-9a-f]{4,})\*/\s+[^;]*?;\s*/\* 0x[0-9a-f]{16} \*/\s*"
                      r"/\* 0x([0-9a-f]{16}) \*/")
_BACKWARD_TARGET = re.compile(r"\bBRA\s+(?:0x)?([0-9a-f]+)\b")
_PREDICATE = re.compile(r"^@!?U?P(?:T|\d+)\s+")
# ForwardRegKernel<kMath, BT, NW, kFold, KMAX, KWG>; kFold, KMAX and KWG
# absent from the names of older builds.
_REG_KERNEL = re.compile(
    r"ForwardRegKernelILi(\d+)ELi(\d+)ELi(\d+)E(?:Lb(\d)E)?(?:Li(\d+)E)?(?:Lb(\d)E)?")
_REG_MAX_K = 128  # kRegMaxK: KMAX's default
# CodesGradMmaKernel<kMath, BT, KMAX>; KMAX absent from older builds' names.
_GRAD_MMA_KERNEL = re.compile(r"CodesGradMmaKernelILi(\d+)ELi(\d+)E(?:Li(\d+)E)?")
# nvdisasm -g: a function's section header, a source position, a label.
_NV_SECTION = re.compile(r"^//-+ \.text\.(\S+) -+$", re.M)
_NV_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_NV_LABEL = re.compile(r"^\s*(\.L_x_\d+):\s*$")
_NV_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
# nvdisasm -hex: an instruction's second word, alone on the line after it.
_NV_CONTROL = re.compile(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$")
_MATH = {1: "3xtf32", 2: "tf32"}  # ecoc_engine.cuh: kMath3xTf32 = 1, kMathTf32 = 2


def stall_cycles(word: int) -> int:
    """The stall count of an instruction's control bits (sm_70 and later: bits
    41-44 of its second 64-bit word): the cycles the warp waits before its
    next instruction, which ptxas sets to cover the latency of fixed-latency
    results, a tensor-core product's among them (HMMA sets no scoreboard on
    sm_80/sm_90). Waits on scoreboards (shared and global loads, MUFU) come
    on top at run time."""
    return (word >> 41) & 0xF


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
    lines: dict = field(default_factory=dict)  # address -> "file:line" (nvdisasm -g)
    stalls: dict = field(default_factory=dict)  # address -> stall cycles (cuobjdump listing)

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
        f.stalls = {int(a, 16): stall_cycles(int(w, 16)) for a, w in _CONTROL.findall(body)}
        functions.append(f)
    return functions


def parse_nvdisasm(listing: str) -> list:
    """The functions of an `nvdisasm -g` listing, with each instruction's
    source line (and with -hex its stall count); branch targets (labels
    there) become addresses, as in cuobjdump's listing, so that
    Function.loops works on both."""
    functions = []
    starts = list(_NV_SECTION.finditer(listing))
    for i, m in enumerate(starts):
        body = listing[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(listing)]
        labels, pending, rows, where, stalls = {}, [], [], None, {}
        for line in body.splitlines():
            control = _NV_CONTROL.match(line)
            if control and rows:
                stalls[rows[-1][0]] = stall_cycles(int(control.group(1), 16))
                continue
            pos = _NV_LINE.search(line)
            if pos:
                where = f"{os.path.basename(pos.group(1))}:{pos.group(2)}"
                continue
            label = _NV_LABEL.match(line)
            if label:
                pending.append(label.group(1))
                continue
            ins = _INSTRUCTION.search(line)
            if ins:
                address = int(ins.group(1), 16)
                for name in pending:
                    labels[name] = address
                pending = []
                rows.append((address, ins.group(2).strip(), where))
        f = Function(m.group(1))
        f.instructions = [(a, _NV_TARGET.sub(lambda t: f"0x{labels.get(t.group(1), 0):x}", text))
                          for a, text, _ in rows]
        f.lines = {a: where or "?" for a, _, where in rows}
        f.stalls = stalls
        functions.append(f)
    return functions


@dataclass
class LoopStats:
    tile: collections.Counter
    kstep: collections.Counter
    unroll: int | None = None        # k steps per pass of the k-step loop
    per_tile: int | None = None      # ForwardRegKernel: estimated instructions per tile
    copy_cost: float | None = None   # instructions per 16-byte copy of the code tile
    outer: tuple = ()                # the tile loop's (first, last) address
    inner: tuple = ()                # the k-step loop's
    passes: int = 1                  # k-step loop passes per tile (per-tile estimate)
    staging: tuple = ()              # the staging loop counted in the estimate, if any
    staging_passes: float = 0.0      # its passes per tile
    nested: list = field(default_factory=list)  # the loops directly inside the tile loop
    # Straight-line stretches of the tile body counted other than once:
    # ((first, last) address, weight), the cases of kGradMma's switch.
    regions: list = field(default_factory=list)
    # The stall counts of the tile loop, weighted as per_tile (static where
    # that is None): the cycles one warp needs per tile with every operand it
    # waits on by scoreboard already there. None without control bits.
    cycles: float | None = None

    def weight(self, address: int) -> float:
        """How often the instruction at `address` of the tile loop counts in
        per_tile: the k-step loop's passes times, the staging loop's
        staging_passes, the other nested loops never, the rest once (every
        instruction once where the function has no per-tile estimate)."""
        if self.per_tile is None:
            return 1.0
        for (lo, hi), w in self.regions:
            if lo <= address <= hi:
                return w
        if self.inner[0] <= address <= self.inner[1]:
            return float(self.passes)
        if self.staging and self.staging[0] <= address <= self.staging[1]:
            return self.staging_passes
        if any(lp[0] <= address <= lp[1] for lp in self.nested):
            return 0.0
        return 1.0

    @property
    def tile_total(self) -> int:
        return sum(self.tile.values())

    @property
    def kstep_total(self) -> int:
        return sum(self.kstep.values())

    @property
    def per_hmma(self) -> float:
        """The k-step loop's instructions per tensor-core product: the
        overhead of a product (operand loads, TF32 splits, addressing), comparable
        across kernels and unrolls, where the per-tile estimate is not."""
        return self.kstep_total / self.kstep["HMMA"]


def loop_stats(f: Function, kp: int = 128) -> LoopStats | None:
    """Statistics of f's tile loop, None when no loop holds an HMMA."""
    hist = {lp: f.histogram(*lp) for lp in f.loops()}
    size = {lp: sum(h.values()) for lp, h in hist.items()}
    with_mma = [lp for lp, h in hist.items() if h["HMMA"] > 0]
    if not with_mma:
        return None
    outer = max(with_mma, key=lambda lp: lp[1] - lp[0])
    inner = min(with_mma, key=lambda lp: lp[1] - lp[0])
    st = LoopStats(hist[outer], hist[inner], outer=outer, inner=inner)
    m = _REG_KERNEL.search(f.name)
    if m and inner != outer:
        math, bt, nw = (int(g) for g in m.groups()[:3])
        warp_splits = nw // (bt // 16)           # RegWarpSplits
        per_step = (64 // warp_splits // 8) * (3 if math == 1 else 1)
        st.unroll = max(1, st.kstep["HMMA"] // per_step)
        # The loops directly inside the tile loop: the k-step loop, kp / 8 /
        # unroll passes; the code tile's vector staging (16-byte cp.async,
        # LDGSTS.128), 64 x kp / 4 copies over the block's threads, through
        # the loop with the fewest instructions per copy (the other vector
        # loop and the scalar one serve widths or alignments this tile does
        # not have); every other inner loop is left out.
        st.nested = _nested_loops(hist, outer)
        body = st.tile_total - sum(size[lp] for lp in st.nested)
        # An instantiation for short rows (KMAX) never runs past its KMAX.
        kp = min(kp, int(m.group(5) or _REG_MAX_K))
        st.passes = kp // 8 // st.unroll
        st.per_tile = body + st.passes * st.kstep_total
        per_thread = 64 * (kp // 4) // (nw * 32)
        if _pick_staging(f, st, hist, size, per_thread):
            st.per_tile += round(per_thread * st.copy_cost)
    g = _GRAD_MMA_KERNEL.search(f.name)
    if g and inner != outer:
        _grad_mma_estimate(f, st, hist, size, kp, int(g.group(1)), int(g.group(2)),
                           int(g.group(3) or _REG_MAX_K))
    if f.stalls:
        st.cycles = sum(line_profile(f, st, f.stalls).values())
    return st


def _nested_loops(hist: dict, outer: tuple) -> list:
    """The loops directly inside the loop `outer` (hist: {loop: opcodes})."""
    inside = [lp for lp in hist if lp != outer and outer[0] <= lp[0] and lp[1] <= outer[1]]
    return [lp for lp in inside
            if not any(o != lp and o[0] <= lp[0] and lp[1] <= o[1] for o in inside)]


def _pick_staging(f: Function, st: LoopStats, hist: dict, size: dict, per_thread: int) -> bool:
    """Of st.nested's vector staging loops (16-byte cp.async, LDGSTS.128, no
    HMMA), the one with the fewest instructions per copy into st.staging,
    with its cost per copy and the passes that per_thread copies take; the
    others serve widths or alignments the tile does not have. False where
    there is none."""
    staging = [lp for lp in st.nested if f.vector_copies(*lp) and hist[lp]["HMMA"] == 0]
    if not staging:
        return False
    st.staging = min(staging, key=lambda lp: size[lp] / f.vector_copies(*lp))
    st.copy_cost = size[st.staging] / f.vector_copies(*st.staging)
    st.staging_passes = per_thread / f.vector_copies(*st.staging)
    return True


def _grad_mma_estimate(f: Function, st: LoopStats, hist: dict, size: dict, kp: int, math: int,
                       bt: int, kmax: int) -> None:
    """st.per_tile for CodesGradMmaKernel<math, bt, kmax>: what a warp issues
    per batch tile (bt rows of the block's 32 classes). The tile body once;
    the first product's k-step loop (MmaEngine: 4 n8 tiles per warp at 64
    rows, 1 at 16; three products each in 3xTF32) kp / 8 / unroll times; the
    u tile's bt x kp / 4 sixteen-byte copies over 128 threads through the
    cheapest vector staging loop; the other nested loops not at all (the
    first batch tile's norms: once per block). The second product is
    unrolled: where ptxas made a `switch` of it (one straight-line case per
    count nv of the warp's column blocks, 2 x bt / 8 x nv products each), a
    case counts with the share of the 4 warps that take it at this kp; a
    second product behind tests per block counts whole, exact at kp = KMAX."""
    kp = min(kp, kmax)
    kn = kp // 8
    split = 3 if math == 1 else 1
    st.unroll = max(1, st.kstep["HMMA"] // ((4 if bt == 64 else 1) * split))
    st.passes = kp // 8 // st.unroll
    st.nested = nested = _nested_loops(hist, st.outer)
    _pick_staging(f, st, hist, size, bt * (kp // 4) // (4 * 32))
    # Straight-line stretches of the body: split at branches and branch targets.
    targets = set()
    for _, text in f.instructions:
        m = _BACKWARD_TARGET.search(_PREDICATE.sub("", text))
        if m and opcode(text) == "BRA":
            targets.add(int(m.group(1), 16))
    stretches, current = [], []
    for a, text in f.instructions:
        if not st.outer[0] <= a <= st.outer[1] or any(lp[0] <= a <= lp[1] for lp in nested):
            continue
        if a in targets and current:
            stretches.append(current)
            current = []
        current.append((a, text))
        if opcode(text) in ("BRA", "EXIT"):
            stretches.append(current)
            current = []
    if current:
        stretches.append(current)
    unit = 2 * (bt // 8) * split
    cases = {}
    for stretch in stretches:
        n = sum(1 for _, text in stretch if opcode(text) == "HMMA")
        if n and n % unit == 0:
            cases.setdefault(n // unit, []).append((stretch[0][0], stretch[-1][0]))
    if len(cases) > 1 and all(len(v) == 1 for v in cases.values()):
        counts = [(kn - w + 3) // 4 if w < kn else 0 for w in range(4)]
        st.regions = [(cases[nv][0], counts.count(nv) / 4) for nv in cases]
    st.per_tile = 0  # weight() now applies the estimate's weights
    st.per_tile = round(sum(st.weight(a) for a, _ in f.instructions
                            if st.outer[0] <= a <= st.outer[1]))


def line_profile(f: Function, st: LoopStats, cost: dict | None = None) -> collections.Counter:
    """{source line: instructions} of f's tile loop, weighted as st.per_tile
    where the function has that estimate (each instruction once, the k-step
    loop's st.passes times, the staging loop's st.staging_passes times, the
    other nested loops not at all), else static (every instruction once);
    with `cost` ({address: value}, f.stalls for stall cycles) each
    instruction counts its value instead of 1."""
    out = collections.Counter()
    for a, _ in f.instructions:
        if st.outer[0] <= a <= st.outer[1]:
            out[f.lines.get(a, "?")] += st.weight(a) * (1 if cost is None else cost.get(a, 0))
    return out


def line_table(f: Function, st: LoopStats, top: int, rank: str = "instructions") -> str:
    """Markdown: the tile loop's heaviest source lines (by instructions, or
    with rank="stalls" by stall cycles) with their share and their three
    commonest opcodes, then the rest in one row; with the stall cycles of
    each line where the listing has control bits (nvdisasm -hex)."""
    prof = line_profile(f, st)
    cycles = line_profile(f, st, f.stalls) if f.stalls else collections.Counter()
    total = sum(prof.values())
    ops = collections.defaultdict(collections.Counter)
    for a, text in f.instructions:
        if st.outer[0] <= a <= st.outer[1]:
            ops[f.lines.get(a, "?")][opcode(text)] += 1
    kind = "per tile" if st.per_tile is not None else "static, k-step loop once"
    title = f"#### {short_name(f.name)}: {total:,.0f} instructions"
    if cycles:
        title += f", {sum(cycles.values()):,.0f} stall cycles"
    lines = [f"{title} ({kind})", ""]
    if cycles:
        lines += ["| source line | instructions | share | stall cycles | "
                  "commonest opcodes (static) |", "|---|---:|---:|---:|---|"]
    else:
        lines += ["| source line | instructions | share | commonest opcodes (static) |",
                  "|---|---:|---:|---|"]
    by = cycles if rank == "stalls" and cycles else prof
    ranked = [where for where, _ in by.most_common()]
    for where in ranked[:top]:
        n = prof[where]
        mix = ", ".join(f"{op} {c}" for op, c in ops[where].most_common(3))
        stall = f" {cycles[where]:,.0f} |" if cycles else ""
        lines.append(f"| {where} | {n:,.0f} | {100.0 * n / total:.1f} % |{stall} {mix} |")
    rest = sum(prof[where] for where in ranked[top:])
    if rest:
        stall = f" {sum(cycles[w] for w in ranked[top:]):,.0f} |" if cycles else ""
        lines.append(f"| {len(ranked) - top} other lines | {rest:,.0f} | "
                     f"{100.0 * rest / total:.1f} % |{stall} |")
    return "\n".join(lines)


def short_name(mangled: str) -> str:
    """'_ZN...16ForwardRegKernelILi1ELi64ELi4ELb0ELi128EEEv...' -> 'ForwardRegKernel<3xtf32, 64, 4>'
    (', fold' added for the folded-norms form, Lb1; ', kp ≤ 32' for an
    instantiation for short code rows, KMAX below kRegMaxK; ', wgmma' for
    the kWgmma form, whose products are HGMMA: no HMMA loop, so the tile
    statistics leave it out)."""
    m = _REG_KERNEL.search(mangled)
    if m:
        math, bt, nw = (int(g) for g in m.groups()[:3])
        fold = ", fold" if m.group(4) == "1" else ""
        kmax = int(m.group(5) or _REG_MAX_K)
        short = f", kp ≤ {kmax}" if kmax < _REG_MAX_K else ""
        wg = ", wgmma" if m.group(6) == "1" else ""
        return f"ForwardRegKernel<{_MATH.get(math, math)}, {bt}, {nw}{fold}{short}{wg}>"
    m = re.search(r"\d+([A-Z]\w*?Kernel)(?:I(.*?)EE)?(?:Ev|E)", mangled)
    if not m:
        return mangled
    args = re.findall(r"Li(\d+)E|Lb(\d)E", (m.group(2) or "") + "E")
    return m.group(1) + (f"<{', '.join(a or b for a, b in args)}>" if args else "")


def find_tool(name: str) -> str | None:
    """${NAME}, else `name` on $PATH, else the pip wheel's copy (nvidia-cuda-<name>:
    nvidia/cu*/bin on sys.path), else the one of the CUDA toolkit
    kernels/build.py builds with (its find_cuda); None when there is none."""
    candidates = [os.environ.get(name.upper()), shutil.which(name)]
    for root in sys.path:
        nvidia = os.path.join(root or ".", "nvidia")
        if os.path.isdir(nvidia):
            candidates += [os.path.join(nvidia, d, "bin", name) for d in sorted(os.listdir(nvidia))]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    spec = importlib.util.spec_from_file_location(
        "_ecoc_build", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "build.py"))
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build  # its dataclasses look their module up
    spec.loader.exec_module(build)
    home = build.find_cuda()[1]
    candidate = home and os.path.join(home, "bin", name)
    return candidate if candidate and os.path.isfile(candidate) else None


def find_cuobjdump() -> str | None:
    return find_tool("cuobjdump")


def _run_tool(name: str, args: list) -> str:
    tool = find_tool(name)
    if tool is None:
        raise SystemExit(f"sass_loop_stats: {name} not found (set {name.upper()}, pip install "
                         f"nvidia-cuda-{name}, or pass a saved listing ending in .sass or .txt)")
    # cuobjdump -sass runs nvdisasm: give it the one found here.
    env = dict(os.environ)
    nvdisasm = find_tool("nvdisasm") if name != "nvdisasm" else None
    if nvdisasm:
        env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([tool, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        hint = (" (nvdisasm lists one cubin: build it with nvcc -cubin -lineinfo "
                "-gencode=arch=compute_90,code=sm_90 ..., not a fatbinary object)"
                if name == "nvdisasm" else "")
        raise SystemExit(f"sass_loop_stats: {name} {' '.join(args)} failed: "
                         f"{proc.stderr.strip()}{hint}")
    return proc.stdout


_REGISTER = re.compile(r"\bR(\d+)\b")
_NO_DESTINATION = ("ST", "STS", "STG", "STL", "RED", "BRA", "BAR", "EXIT", "RET", "CALL",
                   "ISETP", "FSETP")


def _operands(text: str) -> tuple:
    """(opcode, destination registers, source registers) of one instruction;
    a vector load's destination covers 2 or 4 registers (LDS.64, .128)."""
    body = _PREDICATE.sub("", text)
    op, _, rest = body.partition(" ")
    fields = [x.strip() for x in rest.split(",")] if rest else []
    regs = [[int(r) for r in _REGISTER.findall(x)] for x in fields]
    base = op.split(".")[0]
    if not regs or base in _NO_DESTINATION:
        return base, [], [r for x in regs for r in x]
    width = 4 if ".128" in op else 2 if ".64" in op else 1
    dest = [regs[0][0] + i for i in range(width)] if regs[0] else []
    return base, dest, [r for x in regs[1:] for r in x]


@dataclass
class LoadsAhead:
    start: int
    end: int
    instructions: int
    loads: int
    uses: list  # loads in flight at each use of a loaded register

    @property
    def mean(self) -> float:
        return sum(self.uses) / len(self.uses) if self.uses else 0.0


def loads_ahead(f: Function, min_loads: int = 8) -> list:
    """LoadsAhead of each innermost loop of f with at least min_loads LDS."""
    loops = f.loops()
    inner = [(lo, hi) for lo, hi in loops
             if not any((lo, hi) != (a, b) and lo <= a and b <= hi for a, b in loops)]
    out = []
    for lo, hi in sorted(inner):
        body = [t for a, t in f.instructions if lo <= a <= hi]
        pending, uses, loads = [], [], 0
        for text in body:
            base, dest, srcs = _operands(text)
            hit = [p for p in pending if p & set(srcs)]
            if hit:
                uses.append(len(pending))
                pending = [p for p in pending if p not in hit]
            # A register written again no longer holds the load's value.
            pending = [p - set(dest) for p in pending if p - set(dest)]
            if base == "LDS" and dest:
                pending.append(set(dest))
                loads += 1
        if loads >= min_loads:
            out.append(LoadsAhead(lo, hi, len(body), loads, uses))
    return out


def collect_loads_ahead(path: str, kernel: str) -> dict:
    """{short name: [LoadsAhead]} of the matching functions."""
    pattern = re.compile(kernel)
    out = {}
    for f in parse(read_listing(path)):
        if pattern.search(f.name):
            found = loads_ahead(f)
            if found:
                out[short_name(f.name)] = found
    return out


def loads_ahead_table(new: dict, old: dict | None) -> str:
    """Markdown: each function's loops, the old listing's beside them by
    position (the n-th such loop of the same function)."""
    rows = ["| kernel | loop | instructions | LDS | uses | loads in flight at a use: min / mean |",
            "|---|---|---:|---:|---:|---|"]
    for name, loops in new.items():
        before = (old or {}).get(name, [])
        for i, la in enumerate(loops):
            ob = before[i] if i < len(before) else None
            cell = f"{min(la.uses, default=0)} / {la.mean:.1f}"
            if ob is not None:
                cell = f"{min(ob.uses, default=0)} / {ob.mean:.1f} → {cell}"
            rows.append(f"| {name} | {la.start:#x}-{la.end:#x} | {la.instructions:,} | "
                        f"{la.loads} | {len(la.uses)} | {cell} |")
    return "\n".join(rows)


def read_listing(path: str, line_info: bool = False) -> str:
    """The listing of `path`: the file itself if it is one (.sass, .txt),
    else cuobjdump -sass of it, or with line_info nvdisasm -g (a cubin)."""
    if path.endswith((".sass", ".txt")):
        with open(path) as fh:
            return fh.read()
    if line_info:
        return _run_tool("nvdisasm", ["-g", "-hex", path])
    return _run_tool("cuobjdump", ["-sass", path])


def by_line(path: str, kernel: str, kp: int, top: int, rank: str = "instructions") -> str:
    """The line tables of the matching functions with an HMMA loop."""
    pattern = re.compile(kernel)
    listing = read_listing(path, line_info=True)
    if "//## File" not in listing:
        raise SystemExit(f"sass_loop_stats: {path} has no line information (build the cubin "
                         "with nvcc -lineinfo, and list it with nvdisasm -g)")
    tables = []
    for f in parse_nvdisasm(listing):
        st = loop_stats(f, kp) if pattern.search(f.name) else None
        if st is not None:
            tables.append(line_table(f, st, top, rank))
    return "\n\n".join(tables)


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
    head = ("| kernel | tile loop | k-step loop (unroll) | k-step loop per HMMA | per tile, kp = "
            f"{kp} | stall cycles per tile | HMMA in tile loop | branches | global loads |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, st in new.items():
        o = (old or {}).get(name)
        ks = f"{st.kstep_total}" + (f" (×{st.unroll})" if st.unroll else "")
        if o is not None:
            ks = f"{o.kstep_total} → {ks}"
        lines.append(
            f"| {name} | {_cell(o and o.tile_total, st.tile_total)} | {ks} | "
            f"{_cell(o and o.per_hmma, st.per_hmma, '{:.1f}')} | "
            f"{_cell(o and o.per_tile, st.per_tile)} | "
            f"{_cell(o and o.cycles, st.cycles, '{:,.0f}')} | "
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
    p.add_argument("--by-line", action="store_true",
                   help="per source line instead (NEW: a cubin built with -lineinfo, or a saved "
                        "nvdisasm -g listing)")
    p.add_argument("--top", type=int, default=12, help="--by-line: source lines per function")
    p.add_argument("--rank", choices=("instructions", "stalls"), default="instructions",
                   help="--by-line: order the source lines by instructions or by stall cycles")
    p.add_argument("--loads-ahead", action="store_true",
                   help="shared loads in flight at each use, per innermost loop with >= 8 LDS "
                        "(every matching function, with or without HMMA)")
    args = p.parse_args(argv)
    if args.kp <= 0 or args.kp % 8 or args.kp > 128:
        p.error(f"--kp must be a multiple of 8 in [8, 128]. Received: --kp={args.kp}")
    if args.top < 1:
        p.error(f"--top must be a positive integer. Received: --top={args.top}")
    if args.loads_ahead:
        if args.by_line:
            p.error("--loads-ahead and --by-line are two reports: ask for one")
        new = collect_loads_ahead(args.new, args.kernel)
        if not new:
            print(f"no function matching {args.kernel!r} has a loop with 8 or more LDS",
                  file=sys.stderr)
            return 1
        old = collect_loads_ahead(args.compare, args.kernel) if args.compare else None
        print(loads_ahead_table(new, old))
        return 0
    if args.by_line:
        if args.compare:
            p.error("--by-line takes one listing; --compare is for the loop table")
        out = by_line(args.new, args.kernel, args.kp, args.top, args.rank)
        if not out:
            print(f"no function matching {args.kernel!r} has a loop with HMMA", file=sys.stderr)
            return 1
        print(out)
        return 0
    new = collect(args.new, args.kernel, args.kp)
    if not new:
        print(f"no function matching {args.kernel!r} has a loop with HMMA", file=sys.stderr)
        return 1
    old = collect(args.compare, args.kernel, args.kp) if args.compare else None
    print(table(new, old, args.kp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
