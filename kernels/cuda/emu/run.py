#!/usr/bin/env python3
"""Build and run the CUDA harness (or a small CUDA program) on the CPU emulator.

    python kernels/cuda/emu/run.py [--src-root DIR] [--arch 90] [--sms N] [--] <harness args>

The kernel sources of ``DIR/kernels/cuda`` (default: this checkout) are
copied to ``build/emu/``, rewritten where g++ cannot parse CUDA (launches,
``extern __shared__``; see rewrite.py), compiled with
``g++ -O0 -g -fsanitize=address,undefined`` (``--optimize``: -O1) against
the emulator's CUDA headers (emu/include) with ``-D__CUDA_ARCH__=<arch>0``,
linked with emu_runtime.cc and run. Objects and binaries are cached by
content hash (of the unit, the headers it includes and the flags), so a
second run with the same sources only runs, and a change to one header
rebuilds only the units that include it.

Exit status: the program's own (the harness: 0 = all checks passed, 1 = a
check failed); 66 = AddressSanitizer report, 67 = UndefinedBehaviorSanitizer
report; 134 (SIGABRT) = the emulator aborted (divergence, deadlock, a barrier
reached by part of a block, ...; the message is on stderr); 3 = build error.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

EMU_DIR = Path(__file__).resolve().parent
REPO_ROOT = EMU_DIR.parents[2]
sys.path.insert(0, str(EMU_DIR))
import rewrite  # noqa: E402

ARCHS = (75, 80, 86, 89, 90)
CXX = os.environ.get("CXX", "g++")
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
CXXFLAGS = ["-std=c++17", "-g", "-fno-omit-frame-pointer", "-ffp-contract=off",
            "-DKERAS_ECOC_EMULATOR", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function",
            "-Wno-unused-variable", "-Wno-unused-but-set-variable"] + SANITIZE
# Optimisation of the translation units under test. -O0 by default: with
# ASan, -O1 costs about three times the compile time (harness 11 s against
# 4 s, kernels 10 s against 3.5 s of CPU per architecture, measured on the
# project's 2-core machine), which a cold test run pays for five builds,
# while the harness's --check-only --quick set runs 3.1 s instead of 2.3 s.
# --optimize (-O1) is for long runs: the full --check-only set or --grid.
UNIT_OPT, OPTIMIZED_UNIT_OPT = "-O0", "-O1"
SOURCE_SUFFIXES = (".h", ".cuh", ".cu", ".cc", ".hpp", ".inc")
HARNESS = "harness.cu"
KERNELS = "ecoc_kernels.cu.cc"
ASAN_EXIT, UBSAN_EXIT = 66, 67
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def log(msg: str) -> None:
    print(f"[emu] {msg}", file=sys.stderr, flush=True)


def _hash(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _compiler_id() -> str:
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, text=True,
                               check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"[emu] no C++ compiler ({CXX}): {exc}")


def list_marked_barriers(cuda_dir: Path) -> list[tuple[str, int, str]]:
    """(file, line, text) of each ``[barrier-mutation-test]`` line, in build order."""
    out = []
    for path in sorted(cuda_dir.iterdir()):
        if path.is_file() and path.name.endswith(SOURCE_SUFFIXES) and path.name != HARNESS:
            for line_no, line in rewrite.marked_barriers(path.read_text()):
                out.append((path.name, line_no, line.strip()))
    return out


def stage_sources(cuda_dir: Path, stage_root: Path, switched: list[tuple[str, int, str]],
                  extra: list[Path], headers_only: bool = False) -> tuple[Path, dict[str, str]]:
    """Copies and rewrites the sources; returns (staged kernels/cuda dir, name -> text).

    ``switched``: list_marked_barriers's answer for ``cuda_dir`` when the
    marked barriers go behind the emulator's run-time switch
    (rewrite.switchable_barriers, numbered in that order), else empty.
    """
    texts: dict[str, str] = {}
    first_index = {}
    for i, (name, _, _) in enumerate(switched):
        first_index.setdefault(name, i)
    sources = []
    if cuda_dir.is_dir():
        sources = [p for p in sorted(cuda_dir.iterdir())
                   if p.is_file() and p.name.endswith(SOURCE_SUFFIXES)
                   and not (headers_only and p.name.endswith((".cu", ".cc")))]
    sources += extra
    for path in sources:
        text = path.read_text()
        if path.name in first_index and path.parent == cuda_dir:
            text = rewrite.switchable_barriers(text, first_index[path.name], str(path))
        try:
            display = str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
            new, _ = rewrite.rewrite(text, str(path), display)
        except rewrite.RewriteError as exc:
            raise SystemExit(f"[emu] cannot rewrite {path}: {exc}")
        texts[path.name] = new
    texts["emu/ptx_emu.h"] = (EMU_DIR / "ptx_emu.h").read_text()
    key = _hash(*(f"{k}\n{v}" for k, v in sorted(texts.items())))
    stage = stage_root / f"src-{key}" / "kernels" / "cuda"
    if not stage.is_dir():
        tmp = Path(tempfile.mkdtemp(dir=stage_root, prefix="tmp-src-"))
        for name, text in texts.items():
            dest = tmp / "kernels" / "cuda" / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
        try:
            stage.parent.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp / "kernels", stage.parent)
        except OSError:
            if not stage.is_dir():
                raise
        shutil.rmtree(tmp, ignore_errors=True)
    return stage, texts


def included_texts(unit: str, texts: dict[str, str]) -> list[str]:
    """Names of the staged files ``unit`` includes, directly or not, sorted.

    ``#include "x"`` is looked up among the staged sources (kernels/cuda and
    emu/ptx_emu.h); anything else comes from emu/include, which every key
    covers whole. Conditional includes count as included: a key may cover a
    header the unit does not use, never the reverse.
    """
    seen: set[str] = set()
    todo = [unit]
    while todo:
        for name in _LOCAL_INCLUDE.findall(texts[todo.pop()]):
            if name in texts and name not in seen:
                seen.add(name)
                todo.append(name)
    return sorted(seen)


def compile_objects(jobs: list[tuple[Path, list[str], Path]]) -> None:
    """Compiles (source, flags, object) jobs, two at a time, skipping cached objects."""
    pending = [j for j in jobs if not j[2].exists()]
    for src, flags, obj in jobs:
        if obj.exists():
            log(f"cached {src.name} -> {obj.name}")
    running: list[tuple[subprocess.Popen, Path, Path, Path]] = []
    parallel = max(1, min(len(pending), os.cpu_count() or 1, 2))
    failed = []
    while pending or running:
        while pending and len(running) < parallel:
            src, flags, obj = pending.pop(0)
            obj.parent.mkdir(parents=True, exist_ok=True)
            tmp = obj.with_suffix(f".tmp{os.getpid()}.o")
            cmd = [CXX, *flags, "-c", str(src), "-o", str(tmp)]
            log("compiling " + src.name + ": " + " ".join(cmd[1:]))
            running.append((subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True), src, obj, tmp))
        proc, src, obj, tmp = running.pop(0)
        _, err = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"{src}:\n{err}")
            tmp.unlink(missing_ok=True)
        else:
            if err.strip():
                sys.stderr.write(err)
            os.replace(tmp, obj)
    if failed:
        sys.stderr.write("".join(failed))
        raise SystemExit(3)


def build(args: argparse.Namespace) -> Path:
    src_root = Path(args.src_root).resolve()
    cuda_dir = src_root / "kernels" / "cuda"
    build_dir = Path(args.build_dir).resolve() if args.build_dir else REPO_ROOT / "build" / "emu"
    build_dir.mkdir(parents=True, exist_ok=True)
    programs = [Path(p).resolve() for p in args.program]
    # Programs see the headers of kernels/cuda (ecoc_ptx.cuh, ...) but not
    # the harness or the kernels' translation unit.
    switched = []
    if args.delete_marked_barrier is not None:
        switched = list_marked_barriers(cuda_dir) if cuda_dir.is_dir() else []
        count = len(switched)
        if not 0 <= args.delete_marked_barrier < count:
            raise SystemExit(f"[emu] --delete-marked-barrier {args.delete_marked_barrier}: the "
                             f"sources have {count} marked barriers (0 .. {count - 1})")
    stage, texts = stage_sources(cuda_dir, build_dir, switched, programs,
                                 headers_only=bool(programs))
    include = ["-I" + str(EMU_DIR / "include"), "-I" + str(stage.parent), "-I" + str(stage)]
    emu_files = "".join(p.read_text() for p in sorted((EMU_DIR / "include").iterdir()))
    emu_files += (EMU_DIR / "ptx_emu.h").read_text()
    compiler = _compiler_id()
    arch_flag = f"-D__CUDA_ARCH__={args.arch * 10}"
    obj_dir = build_dir / "obj"
    jobs = []
    runtime_src = EMU_DIR / "emu_runtime.cc"
    # The runtime: linked with ASan but not instrumented (see emu_runtime.cc).
    runtime_flags = [f for f in CXXFLAGS if f not in SANITIZE] + [
        "-O2", "-fsanitize=undefined", "-fno-sanitize-recover=undefined",
        "-DKERAS_ECOC_EMU_ASAN=1", "-I" + str(EMU_DIR / "include")]
    jobs.append((runtime_src, runtime_flags,
                 obj_dir / f"runtime-{_hash(compiler, *runtime_flags, emu_files, runtime_src.read_text())}.o"))
    arch_src = build_dir / f"arch{args.arch}.cc"
    if not arch_src.exists():  # written atomically: parallel test workers share build/emu
        tmp_src = arch_src.with_name(f"{arch_src.name}.tmp{os.getpid()}")
        tmp_src.write_text(f'extern "C" {{ int keras_ecoc_emu_compiled_arch = {args.arch * 10}; }}\n')
        os.replace(tmp_src, arch_src)
    jobs.append((arch_src, ["-O0"], obj_dir / f"arch{args.arch}-{_hash(compiler, arch_src.read_text())}.o"))
    units = [p.name for p in programs]
    if not programs:
        units = [u for u in (HARNESS, KERNELS) if u in texts]
        missing = {HARNESS, KERNELS} - set(units)
        if missing:
            raise SystemExit(f"[emu] {cuda_dir} has no {', '.join(sorted(missing))}")
    opt = OPTIMIZED_UNIT_OPT if args.optimize else UNIT_OPT
    for unit in units:
        flags = ["-x", "c++"] + CXXFLAGS + [opt]
        if unit != HARNESS:  # host-only code is compiled without __CUDA_ARCH__
            flags.append(arch_flag)
            if args.arch == 90:
                # The sm_90 build stands for the harness's sm_90a image
                # (device_check.sh), whose kernels may use wgmma.
                flags.append("-DKERAS_ECOC_SM90A_IMAGE=1")
        # The key leaves out the staging directory (its name hashes every
        # source): the mutants' switchable barriers (all in kernel headers),
        # or an edited harness, must not rebuild the units that do not
        # include the changed file.
        # The staged files carry #line directives with their repository
        # paths, so an object does not depend on where it was staged.
        included = included_texts(unit, texts)
        key = _hash(compiler, *flags, texts[unit], *(f"{k}\n{texts[k]}" for k in included),
                    emu_files)
        flags += include
        jobs.append((stage / unit, flags, obj_dir / f"{unit.replace('.', '_')}-{key}.o"))
    compile_objects(jobs)
    objs = [j[2] for j in jobs]
    binary = build_dir / "bin" / f"{'prog' if programs else 'harness'}-{_hash(*(o.name for o in objs))}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_name(binary.name + f".tmp{os.getpid()}")
        cmd = [CXX, *SANITIZE, *map(str, objs), "-o", str(tmp)]
        log("linking " + binary.name)
        res = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
        if res.returncode != 0:
            sys.stderr.write(res.stderr)
            raise SystemExit(3)
        os.replace(tmp, binary)
    else:
        log(f"cached binary {binary.name}")
    return binary


def run_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env["KERAS_ECOC_EMU_ARCH"] = str(args.device_arch or args.arch)
    if args.sms is not None:
        env["KERAS_ECOC_EMU_SMS"] = str(args.sms)
    if args.smem_optin is not None:
        env["KERAS_ECOC_EMU_SMEM_OPTIN"] = str(args.smem_optin)
    if args.shuffle_blocks is not None:
        env["KERAS_ECOC_EMU_SHUFFLE_BLOCKS"] = str(args.shuffle_blocks)
    if args.schedule is not None:
        env["KERAS_ECOC_EMU_SCHEDULE"] = args.schedule
    if args.launch_log is not None:
        env["KERAS_ECOC_EMU_LAUNCH_LOG"] = str(Path(args.launch_log).resolve())
    if args.cp_async is not None:
        env["KERAS_ECOC_EMU_CP_ASYNC"] = args.cp_async
    if args.delete_marked_barrier is not None:
        env["KERAS_ECOC_EMU_DELETE_BARRIER"] = str(args.delete_marked_barrier)
    # Sanitizer reports get their own exit codes (the harness uses 1 for a
    # failed check); leaks are not the question here.
    env["ASAN_OPTIONS"] = (f"exitcode={ASAN_EXIT}:detect_leaks=0:abort_on_error=0:"
                           + env.get("ASAN_OPTIONS", ""))
    env["UBSAN_OPTIONS"] = (f"exitcode={UBSAN_EXIT}:print_stacktrace=1:halt_on_error=1:"
                            + env.get("UBSAN_OPTIONS", ""))
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src-root", default=str(REPO_ROOT),
                   help="tree whose kernels/cuda is built (default: this checkout)")
    p.add_argument("--arch", type=int, default=90, choices=ARCHS,
                   help="__CUDA_ARCH__ / 10 to compile for, and the simulated device (default 90)")
    p.add_argument("--device-arch", type=int, choices=ARCHS,
                   help="simulated device if not --arch (e.g. sm_80 code on an sm_86 card)")
    p.add_argument("--sms", type=int, help="simulated SM count (default: the card's)")
    p.add_argument("--smem-optin", type=int,
                   help="simulated opt-in shared memory per block, bytes (default: the card's)")
    p.add_argument("--shuffle-blocks", type=int, metavar="SEED",
                   help="run the blocks of each launch in a shuffled order")
    p.add_argument("--schedule", help="fiber order per round: random[:SEED] (default), forward, "
                                      "reverse; warps / warps-reverse: one warp per round, the "
                                      "first / last with a runnable thread")
    p.add_argument("--launch-log", metavar="FILE", help="append one line per kernel launch")
    p.add_argument("--cp-async", choices=["deferred", "eager"],
                   help="when a cp.async copies on sm_80+: at the wait that retires it "
                        "(deferred, the default: catches a read before the wait) or when "
                        "issued (eager: catches a copy into a buffer other threads still read)")
    p.add_argument("--delete-marked-barrier", type=int, metavar="I",
                   help="delete the barrier on the I-th [barrier-mutation-test] line: one build "
                        "with every marked barrier behind a run-time switch serves each I "
                        "(the sources are not changed)")
    p.add_argument("--list-marked-barriers", action="store_true",
                   help="print the [barrier-mutation-test] lines and exit")
    p.add_argument("--list-kernels", action="store_true",
                   help="print the names of the __global__ functions of the sources and exit")
    p.add_argument("--program", action="append", default=[], metavar="FILE.cu",
                   help="build these self-contained CUDA files instead of the harness")
    p.add_argument("--build-dir", help="cache directory (default: <repo>/build/emu)")
    p.add_argument("--build-only", action="store_true", help="build, print the binary path, exit")
    p.add_argument("--optimize", action="store_true",
                   help="compile the harness, kernels or programs with -O1 instead of -O0 (slower "
                        "to build, faster to run: for the full --check-only set or --grid)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of the harness")
    args = p.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest

    if args.list_marked_barriers:
        for name, line, text in list_marked_barriers(Path(args.src_root).resolve() / "kernels" / "cuda"):
            print(f"{name}:{line}: {text}")
        return 0
    if args.list_kernels:
        cuda_dir = Path(args.src_root).resolve() / "kernels" / "cuda"
        for path in sorted(cuda_dir.iterdir()):
            if path.is_file() and (path.name == KERNELS or path.name.endswith((".h", ".cuh"))):
                for name in rewrite.kernel_names(path.read_text()):
                    print(name)
        return 0
    binary = build(args)
    if args.build_only:
        print(binary)
        return 0
    env = run_env(args)
    log(f"running {binary.name} {' '.join(rest)} (device sm_{env['KERAS_ECOC_EMU_ARCH']}"
        + (f", {args.sms} SMs" if args.sms else "") + ")")
    rc = subprocess.run([str(binary), *rest], env=env).returncode
    return 128 - rc if rc < 0 else rc  # killed by signal N: 128 + N, as a shell says


if __name__ == "__main__":
    sys.exit(main())
