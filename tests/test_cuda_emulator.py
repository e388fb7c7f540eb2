"""The CUDA kernels and their harness, run on the CPU emulator (kernels/cuda/emu).

No GPU is needed: kernels/cuda/emu/run.py compiles the real kernel source and
harness with g++ (-fsanitize=address,undefined) against the emulator, whose
threads are fibers, whose barriers and warp intrinsics are rendezvous that
abort on divergence, and whose shared memory is NaN-filled and guarded by
ASan redzones. Builds are cached under build/emu/ by content hash.

KERAS_ECOC_EMU_SRC_ROOT=DIR runs the harness tests on DIR/kernels/cuda
instead of this checkout's (for instance a branch extracted with git archive).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script

REPO = Path(__file__).resolve().parents[1]
EMU = REPO / "kernels" / "cuda" / "emu"
RUN = EMU / "run.py"
SELFTEST = EMU / "selftest"
SRC_ROOT = Path(os.environ.get("KERAS_ECOC_EMU_SRC_ROOT", str(REPO))).resolve()
CUDA_DIR = SRC_ROOT / "kernels" / "cuda"

ASAN_EXIT, UBSAN_EXIT = 66, 67
SIGABRT_CODES = (134,)  # run.py reports death by signal N as 128 + N

pytestmark = [
    pytest.mark.skipif(
        shutil.which(os.environ.get("CXX", "g++")) is None or not sys.platform.startswith("linux"),
        reason="the CUDA emulator needs g++ with AddressSanitizer on Linux",
    ),
    # Nothing here depends on the Keras backend: `make test` runs the suite
    # once per backend, and these run in its TensorFlow pass only.
    pytest.mark.skipif(
        os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
        reason="backend-independent; runs in the TensorFlow pass of make test",
    ),
]


def run_emu(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(RUN), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _fail_message(res: subprocess.CompletedProcess) -> str:
    failed = [line for line in res.stdout.splitlines() if line.startswith("FAIL")]
    return (f"exit {res.returncode}\nfailed checks:\n" + "\n".join(failed[:20])
            + f"\nstdout tail:\n{res.stdout[-3000:]}\nstderr tail:\n{res.stderr[-5000:]}")


def _kernel_tree_problem() -> str | None:
    """Why this tree's kernel sources cannot be built, or None."""
    kernels, header = CUDA_DIR / "ecoc_kernels.cu.cc", CUDA_DIR / "ecoc_kernels.h"
    if not kernels.is_file() or not (CUDA_DIR / "harness.cu").is_file():
        return f"no kernel sources under {CUDA_DIR}"
    if "struct ForwardParams" in header.read_text() and "ForwardParams" not in kernels.read_text():
        return ("ecoc_kernels.cu.cc still implements contract v1 while ecoc_kernels.h is v2 "
                "(the v2 kernels land from branch k16kern)")
    return None


needs_kernels = pytest.mark.skipif(_kernel_tree_problem() is not None,
                                   reason=str(_kernel_tree_problem()))


# ---------------------------------------------------------------------------
# The harness's checks under several simulated devices.

# (id, run.py options, harness arguments). Together they run every
# kernel instantiation of the launchers, the >48 KiB dynamic shared memory
# path, several SM counts (grid-stride loops, split counts) and the three
# architecture branches (sm_75 without cp.async/mma, Ampere, Hopper). The
# first runs the harness's --quick check set: every launch variant and rule
# of --check-only (odd shapes, NaN/zero rows, ties, fp16/bf16 z, int64
# labels, three math modes, several column stages, both combines, n = 1,
# B = 1) at the smallest sizes that reach it, 3 s of CPU here against 35 s
# for the full set, which stays for GPU runs.
HARNESS_RUNS = [
    ("sm90-h100-2sms-checks", ["--arch", "90", "--sms", "2"], ["--check-only", "--quick"]),
    ("sm80-on-a10-3sms-small", ["--arch", "80", "--device-arch", "86", "--sms", "3"],
     ["--small", "--math", "3xtf32"]),
    ("sm80-a100-smem-limit", ["--arch", "80"], ["--smem-limit", "--quick"]),
    ("sm75-t4-2sms-small-fp32", ["--arch", "75", "--sms", "2"], ["--small", "--math", "fp32"]),
    # Eager cp.async and the warp-major schedule here (copies land when
    # issued; one warp runs up to the next block barrier before the others):
    # the intact kernels must pass under the timings a GPU may choose.
    ("sm90-l4-like-optin-shuffled", ["--arch", "90", "--device-arch", "89", "--sms", "5",
                                     "--shuffle-blocks", "7", "--schedule", "warps-reverse",
                                     "--cp-async", "eager"],
     ["--small", "--math", "tf32"]),
]

_LAUNCH_LOGS: dict[str, Path] = {}

# Harness arguments of the barrier-deletion test: the quick check set must
# itself catch a missing barrier. Each mutant runs the section of the set
# that exercises its barrier (the marker's only=SECTION; a failing subset
# fails the set), and --fail-fast stops it at its first failed check. The
# whole set takes about a minute under the emulator, and there are 17.
MUTATION_ARGS = ["--check-only", "--quick", "--fail-fast"]


def _marked_barriers() -> list[str]:
    res = run_emu("--src-root", str(SRC_ROOT), "--list-marked-barriers")
    return [line for line in res.stdout.splitlines() if line.strip()]


def _needed_builds(test_names: set[str]) -> list[list[str]]:
    """run.py options of every binary the selected tests of this file build."""
    harness = _kernel_tree_problem() is None
    builds: list[list[str]] = []
    if harness and test_names & {"test_harness_checks_pass_under_the_emulator",
                                 "test_harness_runs_launch_every_kernel_variant_and_the_large_"
                                 "shared_memory_path",
                                 "test_auto_variant_follows_the_fitted_rule_on_each_architecture",
                                 "test_bench_times_each_forward_launch_once_and_names_the_column"}:
        for _, options, _ in HARNESS_RUNS:
            if ["--src-root", str(SRC_ROOT), *options[:2]] not in builds:
                builds.append(["--src-root", str(SRC_ROOT), *options[:2]])
    if harness and "test_deleting_a_marked_barrier_makes_the_harness_fail" in test_names:
        # One build serves every mutant (the barriers are switched at run time).
        builds.append(["--src-root", str(SRC_ROOT), "--arch", "90", "--delete-marked-barrier", "0"])
    # (program, architectures, the tests that run it)
    programs = [
        ("divergence.cu", ["90"], {"test_correct_warp_and_block_synchronisation_runs_and_gives_"
                                   "the_right_values",
                                   "test_divergent_synchronisation_aborts_with_the_call_sites"}),
        ("shared_memory.cu", ["90"], {"test_a_shared_memory_write_past_the_launch_size_trips_asan",
                                      "test_a_cp_async_read_past_a_global_buffer_trips_asan",
                                      "test_shared_memory_limits_nan_fill_and_deferred_cp_async",
                                      "test_eager_cp_async_lands_before_the_wait",
                                      "test_the_warp_major_schedule_lets_one_warp_run_ahead_to_"
                                      "the_next_block_barrier"}),
        ("mma.cu", ["80", "90"], {"test_emulated_tf32_mma_and_cvt_match_an_exact_reference",
                                  "test_emulated_mma_on_special_values_follows_ieee_with_a_"
                                  "canonical_nan",
                                  "test_emulated_mma_is_bit_exact_against_mmasim",
                                  "test_the_finite_tf32_split_rounds_as_cvt_rna_on_finite_"
                                  "operands"}),
        ("mma_random.cu", ["90"], {"test_emulated_sm90_mma_and_cvt_reproduce_a_real_h100_bit_"
                                   "for_bit"}),
    ]
    for program, archs, users in programs:
        if test_names & users:
            builds += [["--arch", a, "--program", str(SELFTEST / program)] for a in archs]
    return builds


# Results of the HARNESS_RUNS, run side by side by _prebuilt: run_id ->
# (CompletedProcess, launch log). A test whose run is not here runs it itself.
_HARNESS_RESULTS: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}


@pytest.fixture(scope="module", autouse=True)
def _prebuilt(request, tmp_path_factory):
    """Builds this file's binaries up front, two compilers at a time, then
    runs the harness runs two at a time.

    Each test would build its own binary on first use, one translation unit
    after another, leaving the second core of a 2-core CI machine idle. The
    first build goes alone (it compiles the shared runtime object); the
    others run side by side. A failed build is left to the test that needs
    it, which rebuilds and reports the compiler's message. Each emulator run
    is single-threaded, so the five harness runs also go two at a time; their
    results are kept for test_harness_checks_pass_under_the_emulator.
    """
    names = {item.originalname for item in request.session.items
             if item.module is request.module}
    builds = _needed_builds(names)
    workers = max(1, min(2, os.cpu_count() or 1))
    if builds:
        run_emu(*builds[0], "--build-only")
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda b: run_emu(*b, "--build-only"), builds[1:]))
    selected = {item.callspec.params["run_id"] for item in request.session.items
                if item.module is request.module
                and item.originalname == "test_harness_checks_pass_under_the_emulator"}
    if selected and _kernel_tree_problem() is None:
        logs = tmp_path_factory.mktemp("emu_launch_logs")

        def run(entry):
            run_id, options, harness_args = entry
            log = logs / f"{run_id}.tsv"
            res = run_emu("--src-root", str(SRC_ROOT), *options, "--launch-log", str(log), "--",
                          *harness_args)
            return run_id, (res, log)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            _HARNESS_RESULTS.update(pool.map(run, [r for r in HARNESS_RUNS if r[0] in selected]))


@needs_kernels
@pytest.mark.parametrize("run_id,options,harness_args", HARNESS_RUNS,
                         ids=[r[0] for r in HARNESS_RUNS])
def test_harness_checks_pass_under_the_emulator(run_id, options, harness_args, tmp_path):
    if run_id in _HARNESS_RESULTS:
        res, log = _HARNESS_RESULTS.pop(run_id)
    else:
        log = tmp_path / "launches.tsv"
        res = run_emu("--src-root", str(SRC_ROOT), *options, "--launch-log", str(log), "--",
                      *harness_args)
    assert res.returncode == 0, _fail_message(res)
    summary = re.search(r"(\d+) checks, (\d+) failed", res.stdout)
    assert summary is not None, res.stdout[-2000:]
    assert int(summary.group(1)) > 0 and int(summary.group(2)) == 0
    if "--check-only" in harness_args:
        # The 8-warp register-softmax forward (kWarps8) ran checks of its own.
        for variant in ("regsoftmax+warps8", "rows64+regsoftmax+warps8"):
            assert re.search(rf"^PASS regsoftmax\+warps8 .*variant={re.escape(variant)} ",
                             res.stdout, re.M), f"no {variant} check ran"
        # So did the 128-row one with pre-split code tiles (kRows128), in both
        # TF32 modes.
        for mode in ("3xtf32", "tf32"):
            assert re.search(rf"^PASS rows128 \[math={mode} variant=rows128\+regsoftmax\+warps8 ",
                             res.stdout, re.M), f"no rows128 {mode} check ran"
        # So did the codes gradient's mma second product (kGradMma), in both
        # TF32 modes and on both row tiles, against float64.
        for variant in ("gradmma", "rows64+gradmma"):
            for mode in ("3xtf32", "tf32"):
                assert re.search(rf"^PASS gradmma \[math={mode} variant={re.escape(variant)} "
                                 r".*grad_codes: max abs err [1-9]", res.stdout, re.M), \
                    f"no {variant} {mode} grad_codes check with finite values ran"
    assert log.is_file() and log.stat().st_size > 0
    _LAUNCH_LOGS[run_id] = (log, options)


def _binary_symbols(options: list[str]) -> dict[int, str]:
    res = run_emu("--src-root", str(SRC_ROOT), *options, "--build-only")
    assert res.returncode == 0, res.stderr[-3000:]
    binary = res.stdout.strip().splitlines()[-1]
    nm = subprocess.run(["nm", "-C", "--defined-only", binary], capture_output=True, text=True,
                        check=True)
    out = {}
    for line in nm.stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            out[int(parts[0], 16)] = parts[2]
    return out


@needs_kernels
def test_split_grids_use_more_than_two_blocks_per_sm_and_at_most_four_waves():
    # Every split kernel is launched through one function pointer (`fn` in
    # the log); the combine and prep kernels by name. The splits follow the
    # simulated card's occupancy (launch_shape::ChooseSplits, checked on its
    # own in test_cuda_launch_shape.py; `resident` in the log is the blocks
    # per SM the emulator's occupancy calculator gives that launch, without a
    # register limit): a split grid never asks for more
    # than kMaxSplitWaves = 4 waves of resident blocks (unless one split
    # already needs more), and where shared memory lets more than two blocks
    # share an SM, some grid uses that (the old rule stopped at two per SM).
    missing_runs = [r[0] for r in HARNESS_RUNS if r[0] not in _LAUNCH_LOGS]
    if missing_runs:
        pytest.skip(f"needs the harness runs first (missing: {missing_runs})")
    split_launches = too_many_waves = beyond_two_per_sm = 0
    for log, _ in _LAUNCH_LOGS.values():
        for line in log.read_text().splitlines():
            name, *rest = line.split("\t")
            if name != "fn":
                continue
            fields = dict(f.split("=", 1) for f in rest if "=" in f)
            gx, gy, _ = map(int, fields["grid"].split(","))
            sms = int(fields["sms"])
            slots = sms * max(1, int(fields["resident"]))  # at least 1, as MakePlan
            split_launches += 1
            if gy > 1 and -(-gx * gy // slots) > max(4, -(-gx // slots)):
                too_many_waves += 1
            if gy > 1 and gx * gy > 2 * sms:
                beyond_two_per_sm += 1
    assert split_launches > 100, split_launches
    assert too_many_waves == 0, f"{too_many_waves} split grids ask for more than 4 waves"
    assert beyond_two_per_sm > 0, "no split grid put more than two blocks on an SM"


@needs_kernels
def test_harness_runs_launch_every_kernel_variant_and_the_large_shared_memory_path():
    missing_runs = [r[0] for r in HARNESS_RUNS if r[0] not in _LAUNCH_LOGS]
    if missing_runs:
        pytest.skip(f"needs the harness runs first (missing: {missing_runs})")
    res = run_emu("--src-root", str(SRC_ROOT), "--list-kernels")
    kernel_names = set(res.stdout.split())
    assert kernel_names, "no __global__ functions found in the kernel sources"
    pattern = re.compile(r"(?:^|::)(" + "|".join(map(re.escape, sorted(kernel_names)))
                         + r")(?:<.*>)?\(")
    launched: set[str] = set()
    instantiated: set[str] = set()
    large_smem = 0
    by_options: dict[tuple, list[Path]] = {}
    for log, options in _LAUNCH_LOGS.values():
        compile_opts = tuple(options[:2])  # --arch N: one binary per architecture
        by_options.setdefault(compile_opts, []).append(log)
    for compile_opts, logs in by_options.items():
        symbols = _binary_symbols(list(compile_opts))
        # A lambda in a kernel (and a helper instantiated on it) carries the
        # kernel's name in its own: not a kernel.
        instantiated |= {name for name in symbols.values()
                         if pattern.search(name) and "{lambda" not in name}
        for log in logs:
            for line in log.read_text().splitlines():
                fields = dict(f.split("=", 1) for f in line.split("\t")[1:] if "=" in f)
                name = symbols.get(int(fields["func"], 16), line.split("\t")[0])
                launched.add(name)
                if int(fields["smem"]) > 48 * 1024 and line.endswith("\tok"):
                    large_smem += 1
    assert instantiated, "no kernel instantiation found in the binaries"
    not_run = sorted(instantiated - launched)
    assert not not_run, f"kernel variants never launched by the emulated harness: {not_run}"
    assert large_smem > 0, "no launch used more than 48 KiB of dynamic shared memory"


def _auto_rule(pass_: str, B: int, n: int, k: int, math_mode: str, cc: int) -> str:
    """kAuto's rule as kernels/cuda/README.md states it ("Launch variant choice")."""
    engine = math_mode if cc >= 80 else "fp32"  # no TF32 mma below sm_80
    mma = engine != "fp32" and k <= 128  # G or the logits fit the registers
    if pass_ in ("label_rank", "nearest"):
        # Order decisions were not timed per variant: FP32's v2, and in a
        # TF32 mode the register kernel (3xTF32) with the forward's row tile.
        if not mma:
            return "v2"
        return "rows64+regsoftmax" if B >= 64 else "regsoftmax"
    if pass_ == "codes_grad":
        if mma:
            return "rows64+gradmma" if B >= 64 else "gradmma"
        if B <= 16:
            return "gradpersistent"
        return "rows64" if B >= 64 else "v2"
    if mma:
        if B >= 64:
            return "rows64+regsoftmax"
        return "regsoftmax+warps8" if k <= 32 and n < 300_000 else "regsoftmax"
    if B <= 16:
        return "v2" if engine == "3xtf32" else "foldnorms"
    return "rows64" if 64 <= B < 1024 and k <= 64 else "v2"


_AUTO_LINE = re.compile(r"auto cc=(\d+) pass=(\w+) math=(\w+) B=(\d+) n=(\d+) k=(\d+) -> (\S+)")


@needs_kernels
@pytest.mark.parametrize("arch,cc", [("75", 75), ("80", 80), ("90", 90)],
                         ids=["sm75-t4", "sm80-a100", "sm90-h100"])
def test_auto_variant_follows_the_fitted_rule_on_each_architecture(arch, cc):
    # The harness prints ResolveVariant's answer (what every params struct's
    # default, kAuto, runs) on the simulated card, around each threshold.
    res = run_emu("--src-root", str(SRC_ROOT), "--arch", arch, "--", "--auto-table")
    assert res.returncode == 0, _fail_message(res)
    rows = [m.groups() for m in map(_AUTO_LINE.fullmatch, res.stdout.splitlines()) if m]
    assert len(rows) == 4 * 3 * 11 * 4 * 6, res.stdout[-2000:]
    got = {(p, mm, int(B), int(n), int(k)): v for c, p, mm, B, n, k, v in rows if int(c) == cc}
    assert len(got) == len(rows), f"the harness did not report cc={cc}"
    want = {(p, mm, B, n, k): _auto_rule(p, B, n, k, mm, cc) for p, mm, B, n, k in got}
    wrong = {key: (v, want[key]) for key, v in got.items() if v != want[key]}
    assert not wrong, f"(pass, math, B, n, k): (resolved, rule): {dict(list(wrong.items())[:10])}"
    # The properties the rule is built on, spelled out.
    fwd = {key[1:]: v for key, v in got.items() if key[0] == "forward"}
    grad = {key[1:]: v for key, v in got.items() if key[0] == "codes_grad"}
    assert all("regsoftmax" not in v for (_, _, _, k), v in fwd.items() if k > 128)
    assert all("gradmma" not in v for (_, _, _, k), v in grad.items() if k > 128)
    assert all("rows64" not in v for (p, _, B, _, _), v in got.items() if B <= 16)
    # Order decisions: FP32's v2; asked for in a TF32 mode, the register
    # kernel where the code row fits it (k <= 128, sm_80+).
    decode = {key: v for key, v in got.items() if key[0] in ("label_rank", "nearest")}
    assert all(v == "v2" for (_, mm, _, _, k), v in decode.items()
               if mm == "fp32" or k > 128 or cc < 80)
    if cc >= 80:
        assert decode[("label_rank", "3xtf32", 16, 1000000, 128)] == "regsoftmax"
        assert decode[("nearest", "tf32", 256, 10000, 32)] == "rows64+regsoftmax"
    # The persistent codes gradient only where the batch is one 16-row tile.
    assert all(B <= 16 for (_, B, _, _), v in grad.items() if v == "gradpersistent")
    if cc < 80:
        assert all("regsoftmax" not in v for v in fwd.values()), "no TF32 engine below sm_80"
        assert all("gradmma" not in v for v in grad.values()), "no TF32 engine below sm_80"
        assert fwd[("3xtf32", 16, 10000, 32)] == "foldnorms"  # runs as FP32 there
        assert grad[("3xtf32", 16, 10000, 32)] == "gradpersistent"
    else:
        assert fwd[("3xtf32", 256, 300000, 128)] == "rows64+regsoftmax"
        assert fwd[("3xtf32", 4096, 1000000, 32)] == "rows64+regsoftmax"
        assert fwd[("3xtf32", 16, 10000, 32)] == "regsoftmax+warps8"
        assert fwd[("3xtf32", 16, 10000, 128)] == "regsoftmax"
        assert fwd[("3xtf32", 16, 1000000, 32)] == "regsoftmax"
        assert fwd[("tf32", 4096, 1000000, 32)] == "rows64+regsoftmax"
        assert grad[("3xtf32", 256, 10000, 32)] == "rows64+gradmma"
        assert grad[("tf32", 16, 1000000, 128)] == "gradmma"
        assert grad[("3xtf32", 16, 10000, 129)] == "gradpersistent"
    assert fwd[("fp32", 256, 10000, 32)] == "rows64" and fwd[("fp32", 4096, 10000, 32)] == "v2"
    # 16-row tiles for the FP32 forward above k = 64 (three runs of 2026-11-27/28).
    assert fwd[("fp32", 256, 10000, 65)] == "v2" and fwd[("fp32", 256, 10000, 64)] == "rows64"
    assert grad[("fp32", 256, 10000, 32)] == "rows64" and grad[("fp32", 16, 10000, 32)] == \
        "gradpersistent"


@needs_kernels
def test_bench_times_each_forward_launch_once_and_splits_auto_into_launches(tmp_path,
                                                                           monkeypatch):
    # `--bench-only --variant all` on two small cells: gradmma and
    # gradpersistent run v2's forward launch, rows64+gradmma and
    # rows64+gradmma+wgmma rows64's (`all`
    # leaves out rows64+gradpersistent) and auto the variant of
    # ResolveVariant, in the same math mode, so those columns repeat that
    # column's forward ms and host us (timed once there) and say so in
    # "fwd_from" and in the table's note; the JSON still loads in
    # bench_gpu_loss.py. The decode passes get a table of their own (and
    # "decode_ms" in the JSON).
    out = tmp_path / "bench.json"
    monkeypatch.setenv("ECOC_HARNESS_JSON", str(out))
    res = run_emu("--src-root", str(SRC_ROOT), "--arch", "90", "--sms", "2", "--",
                  "--bench-only", "--tiny", "--variant", "all")
    assert res.returncode == 0, _fail_message(res)
    raw = json.loads(out.read_text())
    gpu_loss = load_script(REPO / "benchmarks" / "bench_gpu_loss.py", "bench_gpu_loss")
    assert len(gpu_loss.load_harness_json(str(out))) == len(raw) == 2 * 15 * 3
    rows = {(r["mode"], r["B"]): r for r in raw}
    auto_forward = set()
    for r in raw:
        math_mode, _, variant = r["mode"].partition("+")
        source = {"gradmma": "v2", "rows64+gradmma": "rows64", "gradpersistent": "v2",
                  "rows64+gradpersistent": "rows64",
                  "rows64+gradmma+wgmma": "rows64"}.get(variant)
        if variant == "auto":
            source = _auto_rule("forward", r["B"], r["n"], r["k"], math_mode, 90)
            auto_forward.add(source)
        expected = None if source is None else (
            math_mode if source == "v2" else f"{math_mode}+{source}")
        assert r.get("fwd_from") == expected, r
        if expected is not None:
            assert r["fwd_ms"] == rows[(expected, r["B"])]["fwd_ms"], r
            assert r["fwd_host_us"] == rows[(expected, r["B"])]["fwd_host_us"], r
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0
        # The host's time to make a call, from its own clock: also positive.
        assert r["fwd_host_us"] > 0 and r["fwdbwd_host_us"] > 0, r
    assert auto_forward == {"foldnorms", "regsoftmax+warps8", "rows64", "rows64+regsoftmax"}
    text = res.stdout
    assert text.count("forward ms: the v2 column's (the same launch, timed once there)") == 6
    assert text.count("forward ms: the rows64 column's") == 6  # rows64+gradmma (+wgmma)
    assert "variant rows64+gradpersistent" not in text
    assert text.count("forward ms: per row, the column of the forward variant auto ran") == 3
    # auto's forward + codes gradient split into its launches (an event after
    # each, SetLaunchObserver): only the auto rows carry "launch_ms", in
    # launch order, each launch named by its pass and step. The codes
    # gradient combines batch splits only where the batch has several row
    # tiles (B = 65 in 64-row tiles; B = 7 is one 16-row tile).
    steps = ["forward prep", "forward split", "forward combine", "codes-grad prep",
             "codes-grad split"]
    for r in raw:
        if not r["mode"].endswith("+auto"):
            assert "launch_ms" not in r, r
            continue
        want = steps + (["codes-grad combine"] if r["B"] == 65 else [])
        assert list(r["launch_ms"]) == want, r
        assert all(v >= 0 for v in r["launch_ms"].values()), r
        assert "launch_ms_unstable" not in r, r
    assert sum("launch_ms" in r for r in raw) == 2 * 3
    # The same rows are timed in blocks of back-to-back calls as well, the
    # way bench_gpu_loss.py times the methods they are compared with (one
    # call per block under the emulator, whose clock means nothing), and
    # bench_gpu_loss.py shows those times; the other rows keep single calls.
    loaded = {(r["mode"], r["B"]): r for r in gpu_loss.load_harness_json(str(out))}
    for r in raw:
        got = loaded[(r["mode"], r["B"])]
        if not r["mode"].endswith("+auto"):
            assert "fwdbwd_block_ms" not in r and got["timing"] == "single calls", r
            assert got["fwdbwd_ms"] == r["fwdbwd_ms"]
            continue
        assert r["fwd_block_ms"] > 0 and r["fwdbwd_block_ms"] > 0, r
        assert r["fwd_block_calls"] == r["fwdbwd_block_calls"] == 1, r
        assert got["timing"] == "blocks", got
        assert (got["fwd_ms"], got["fwdbwd_ms"]) == (r["fwd_block_ms"], r["fwdbwd_block_ms"])
        assert (got["single_fwd_ms"], got["single_fwdbwd_ms"]) == (r["fwd_ms"], r["fwdbwd_ms"])
    per_launch = text.split("### Per launch: math mode 3xtf32, variant auto")[1]
    assert "| fwd ms, blocks | fwd + grad ms, blocks | R (fwd, fwd + grad) |" in per_launch
    assert text.count("### Per launch: math mode") == 3
    assert "forward combine" in text.split("### Per launch: math mode 3xtf32, variant auto")[1]
    # The decode passes, once per cell in variant auto, in FP32 (what the
    # library runs) and 3xTF32 (the register kernel): the label rank (the
    # accuracy metrics' pass in every fit step) against the loss forward of
    # the default math mode, auto's 3xTF32 column.
    decode = text.split("### Decode passes, variant auto")[1]
    assert "the loss forward of the 3xtf32+auto column" in decode
    lines = [line for line in decode.splitlines() if re.match(r"\| \d", line)]
    assert len(lines) == 2, decode
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        B, k, n = (int(c) for c in cells[:3])
        forward_ms, rank32, rank3x, nearest32, nearest3x, r32, r3x, r32_3x = (
            float(c) for c in cells[3:11])
        assert min(rank32, rank3x, nearest32, nearest3x) > 0
        # The table prints 4 decimals, the JSON 6 significant digits.
        assert forward_ms == pytest.approx(rows[("3xtf32+auto", B)]["fwd_ms"], rel=1e-5, abs=1e-4)
        assert r32 == pytest.approx(rank32 / forward_ms, abs=0.006)
        assert r3x == pytest.approx(rank3x / forward_ms, abs=0.006)
        assert r32_3x == pytest.approx(rank32 / rank3x, abs=0.006)
        assert cells[-1] == (f"fp32 {_auto_rule('label_rank', B, n, k, 'fp32', 90)}, "
                             f"3xtf32 {_auto_rule('label_rank', B, n, k, '3xtf32', 90)}")
        # The JSON carries the same four times on that forward's row only.
        timed = rows[("3xtf32+auto", B)]["decode_ms"]
        assert list(timed) == ["rank fp32", "rank 3xtf32", "nearest fp32", "nearest 3xtf32"]
        for got, want in zip(timed.values(), (rank32, rank3x, nearest32, nearest3x)):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-4)
    assert "3xtf32 regsoftmax" in decode and "3xtf32 rows64+regsoftmax" in decode
    assert sum("decode_ms" in r for r in raw) == 2
    # Rewritten after each cell through a temporary file, renamed into place.
    assert not (tmp_path / "bench.json.partial").exists()


@needs_kernels
def test_deleting_a_marked_barrier_makes_the_harness_fail():
    marked = _marked_barriers()
    assert len(marked) >= 2, ("the kernel source must mark at least two barriers with "
                              f"// [barrier-mutation-test]; found {marked}")
    sections = [re.search(r"\[barrier-mutation-test\] only=(\S+)", line) for line in marked]
    unnamed = [line for line, m in zip(marked, sections) if m is None]
    assert not unnamed, ("each marked barrier names the check section that exercises it "
                         f"(// [barrier-mutation-test] only=SECTION): {unnamed}")

    def mutant(index: int) -> subprocess.CompletedProcess:
        # A barrier that frees a cp.async target for the next staging is
        # marked `cp-async=eager`: only copies that land when issued show
        # its absence (deferred ones land after the next barrier).
        # `schedule=warps` adds the emulator's warp-major schedule (one warp
        # runs up to the next block barrier before the others start): where
        # the warps meet at warp intrinsics, the default rounds keep them in
        # step and no warp gets ahead to overwrite a buffer.
        timing = ["--cp-async", "eager"] if "cp-async=eager" in marked[index] else []
        if "schedule=warps" in marked[index]:
            timing += ["--schedule", "warps"]
        return run_emu("--src-root", str(SRC_ROOT), "--arch", "90", "--sms", "2", *timing,
                       "--delete-marked-barrier", str(index), "--", *MUTATION_ARGS,
                       "--only", sections[index].group(1))

    # One mutant per core: each is a single-threaded emulator run.
    with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
        results = list(pool.map(mutant, range(len(marked))))
    for index, (where, res) in enumerate(zip(marked, results)):
        # UBSan's report is a "runtime error:" line (no summary line under
        # halt_on_error), e.g. for a sum of counts read from a NaN-filled
        # buffer.
        caught = (res.returncode in (1, ASAN_EXIT, UBSAN_EXIT, *SIGABRT_CODES)
                  and ("FAIL" in res.stdout or "keras-ecoc CUDA emulator" in res.stderr
                       or "Sanitizer" in res.stderr
                       or (res.returncode == UBSAN_EXIT and "runtime error:" in res.stderr)))
        assert caught, f"deleting the barrier at {where} went unnoticed:\n{_fail_message(res)}"
        if res.returncode == 1:
            # A failed check exits through exit(), where the runtime says how
            # often it skipped the deleted barrier: a mutant that failed
            # without reaching its barrier would show 0.
            skipped = re.search(r"marked barrier (\d+) deleted, skipped (\d+) times", res.stderr)
            assert skipped and int(skipped.group(1)) == index \
                and int(skipped.group(2)) > 0, f"{where}:\n{res.stderr[-2000:]}"


def test_marked_barriers_go_behind_the_run_time_switch_numbered_across_files():
    # The mutants' build: each marked call becomes a conditional call with
    # its index among all marked lines (first_index counts the files before),
    # on the same line; unmarked barriers and other lines stay as they were.
    rewrite = load_script(EMU / "rewrite.py", "_keras_ecoc_emu_rewrite_for_tests")
    text = ("  __syncthreads();\n"
            "  __syncthreads();  // [barrier-mutation-test] only=cases\n"
            "  if (x) ptx::wgmma_wait<1>();  // [barrier-mutation-test] only=auto\n"
            "  __syncwarp(0xffffu);  // [barrier-mutation-test] only=scale")
    out = rewrite.switchable_barriers(text, 5, "k.cuh").split("\n")
    assert out == [
        "  __syncthreads();",
        "  (keras_ecoc_emu_barrier_kept(5) ? __syncthreads() : (void)0);  "
        "// [barrier-mutation-test] only=cases",
        "  if (x) (keras_ecoc_emu_barrier_kept(6) ? ptx::wgmma_wait<1>() : (void)0);  "
        "// [barrier-mutation-test] only=auto",
        "  (keras_ecoc_emu_barrier_kept(7) ? __syncwarp(0xffffu) : (void)0);  "
        "// [barrier-mutation-test] only=scale",
    ]
    with pytest.raises(rewrite.RewriteError, match=r"k\.cuh:1: marked .* has no __syncthreads"):
        rewrite.switchable_barriers("  x = 1;  // [barrier-mutation-test] only=cases", 0, "k.cuh")
    out_of_range = run_emu("--src-root", str(SRC_ROOT), "--delete-marked-barrier", "999",
                           "--build-only")
    assert out_of_range.returncode != 0
    assert "--delete-marked-barrier 999: the sources have" in out_of_range.stderr


@needs_kernels
def test_an_object_is_keyed_by_the_headers_its_unit_includes_and_no_others():
    # Why the mutants' build (its marked barriers switchable, all in kernel
    # headers) rebuilds the kernels but reuses the harness object, and an
    # edited harness reuses the kernels.
    run = load_script(RUN, "_keras_ecoc_emu_run_for_tests")
    texts = {"a.cu": '#include "b.h"\n#include <vector>\n  #  include "emu/x.h"\n',
             "b.h": '#include "c.cuh"\n#include "not_staged.h"\n', "c.cuh": '#include "b.h"\n',
             "d.cuh": "", "emu/x.h": ""}
    assert run.included_texts("a.cu", texts) == ["b.h", "c.cuh", "emu/x.h"]
    assert run.included_texts("d.cuh", texts) == []
    real = {p.name: p.read_text() for p in CUDA_DIR.iterdir() if p.is_file()}
    real["emu/ptx_emu.h"] = (EMU / "ptx_emu.h").read_text()
    harness = run.included_texts("harness.cu", real)
    kernels = run.included_texts("ecoc_kernels.cu.cc", real)
    marked = {line.split(":")[0] for line in _marked_barriers()}
    assert marked and marked <= set(kernels) and not marked & set(harness)
    assert "ecoc_kernels.h" in harness and "emu/ptx_emu.h" in kernels


# ---------------------------------------------------------------------------
# Purpose-written kernels: what the emulator must catch.

def run_selftest(name: str, *args: str, arch: str = "90") -> subprocess.CompletedProcess:
    return run_emu("--arch", arch, "--program", str(SELFTEST / name), "--", *args)


def test_correct_warp_and_block_synchronisation_runs_and_gives_the_right_values():
    res = run_selftest("divergence.cu", "ok")
    assert res.returncode == 0, _fail_message(res)
    assert "0 wrong values" in res.stdout


@pytest.mark.parametrize("case,expected", [
    ("shuffle", r"warp divergence: .*__shfl_xor_sync \(.*divergence\.cu:\d+\).* but thread 16 "
                r"\(lane 16\) of the same warp waits at __shfl_xor_sync \(.*divergence\.cu:\d+\)"),
    ("syncwarp", r"warp divergence: .*__syncwarp .* but thread 16 \(lane 16\) of the same warp "
                 r"has exited"),
    ("syncthreads", r"__syncthreads\(\) \(.*divergence\.cu:\d+\) is reached by only 64 of the "
                    r"block's 128 threads"),
    ("mask", r"mask 0xffff0001, but thread 0 \(lane 0\) of the same warp has exited"),
])
def test_divergent_synchronisation_aborts_with_the_call_sites(case, expected):
    res = run_selftest("divergence.cu", case)
    assert res.returncode in SIGABRT_CODES, _fail_message(res)
    assert re.search(expected, res.stderr), res.stderr[-3000:]
    assert "in kernel " in res.stderr


def test_a_shared_memory_write_past_the_launch_size_trips_asan():
    res = run_selftest("shared_memory.cu", "oob")
    assert res.returncode == ASAN_EXIT, _fail_message(res)
    assert "AddressSanitizer" in res.stderr and "shared_memory.cu:" in res.stderr


def test_a_cp_async_read_past_a_global_buffer_trips_asan():
    res = run_selftest("shared_memory.cu", "cp_async_oob")
    assert res.returncode == ASAN_EXIT, _fail_message(res)
    assert "AddressSanitizer: heap-buffer-overflow" in res.stderr


@pytest.mark.parametrize("case", ["limits", "nan", "cp_async"])
def test_shared_memory_limits_nan_fill_and_deferred_cp_async(case):
    res = run_selftest("shared_memory.cu", case)
    assert res.returncode == 0, _fail_message(res)


@pytest.mark.parametrize("schedule,read", [("forward", "32 ones and 0 NaN"),
                                           ("reverse", "32 ones and 0 NaN"),
                                           ("warps", "32 ones and 0 NaN"),
                                           ("warps-reverse", "0 ones and 32 NaN")])
def test_the_warp_major_schedule_lets_one_warp_run_ahead_to_the_next_block_barrier(schedule, read):
    # Warp 1 reads what warp 0 wrote after a __syncwarp, with no block
    # barrier between: the round schedules advance both warps one intrinsic
    # per round (warp 1 always reads after the write); warps-reverse runs
    # warp 1 to its barrier first, so it reads the fresh (NaN) memory.
    res = run_emu("--arch", "90", "--schedule", schedule, "--program",
                  str(SELFTEST / "shared_memory.cu"), "--", "warp_ahead")
    assert res.returncode == 0, _fail_message(res)
    assert f"warp_ahead: warp 1 read {read} of 32" in res.stdout


def test_eager_cp_async_lands_before_the_wait():
    # The other timing a GPU may choose (run.py --cp-async eager): the same
    # copies, already in shared memory before their wait.
    res = run_emu("--arch", "90", "--cp-async", "eager", "--program",
                  str(SELFTEST / "shared_memory.cu"), "--", "cp_async_eager")
    assert res.returncode == 0, _fail_message(res)
    assert "cp_async_eager: 0 wrong values" in res.stdout


# ---------------------------------------------------------------------------
# cvt.rna.tf32 and mma.sync.m16n8k8 TF32.

def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _exp2_floor(x: Fraction) -> int:
    """floor(log2(|x|)) for x != 0, exactly."""
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    return e


def _round_f32_toward_zero(s: Fraction) -> float:
    if s == 0:
        return 0.0
    e = max(_exp2_floor(s), -126)
    q = Fraction(2) ** (e - 23)
    r = math.trunc(s / q) * q
    if abs(r) >= 2 ** 128:
        return math.copysign(math.inf, r)
    return float(r)


def reference_mma_element(a: list[int], b: list[int], c: float, F: int, L: int,
                          e_zero: int) -> float:
    """One output of the TF32 mma in exact rational arithmetic (finite inputs).

    Written independently of kernels/cuda/emu/ptx_emu.h from the model of
    mmasim: operands truncated to TF32; per chunk of L products plus the
    accumulator, every term is truncated toward zero at 2^(e_max - F), where
    e_max is the largest term exponent (product: sum of the operands'
    exponents, at least -126 each; zero: e_zero); the exact sum is rounded
    toward zero to float32 and feeds the next chunk.
    """
    for k0 in range(0, 8, L):
        terms = []
        for k in range(k0, k0 + L):
            va = Fraction(_f32(a[k] & 0xFFFFE000))
            vb = Fraction(_f32(b[k] & 0xFFFFE000))
            if va == 0 or vb == 0:
                terms.append((Fraction(0), e_zero))
            else:
                terms.append((va * vb, max(_exp2_floor(va), -126) + max(_exp2_floor(vb), -126)))
        vc = Fraction(c)
        terms.append((vc, e_zero if vc == 0 else max(_exp2_floor(vc), -126)))
        e_max = max(e for _, e in terms)
        unit = Fraction(2) ** (e_max - F)
        total = sum(math.trunc(v / unit) * unit for v, _ in terms)
        c = _round_f32_toward_zero(total) + 0.0
    return c


def reference_cvt_rna_tf32(x_bits: int) -> int:
    """Nearest TF32 value (10 fraction bits) with ties away from zero, as bits."""
    if (x_bits & 0x7FFFFFFF) > 0x7F800000:
        return 0x7FFFFFFF
    if (x_bits & 0x7F800000) == 0x7F800000:
        return x_bits
    lo = x_bits & 0xFFFFE000  # same sign, magnitude truncated
    hi = lo + 0x2000          # next TF32 magnitude (may be inf)

    def mag(bits):
        if (bits & 0x7F800000) == 0x7F800000:
            return Fraction(2) ** 128
        return abs(Fraction(_f32(bits)))

    x = mag(x_bits)
    return hi if mag(hi) - x <= x - mag(lo) else lo


def _random_operands(rng: np.random.Generator, count: int, spread: int) -> np.ndarray:
    """float32 bit patterns: normals over 2^-spread..2^spread, zeros, subnormals, ties."""
    x = rng.standard_normal(count) * np.exp2(rng.integers(-spread, spread + 1, count))
    bits = x.astype(np.float32).view(np.uint32).copy()
    kind = rng.random(count)
    bits[kind < 0.05] = 0
    bits[(kind >= 0.05) & (kind < 0.08)] = rng.integers(1, 1 << 23, int(((kind >= 0.05) & (kind < 0.08)).sum()), dtype=np.uint32)
    tie = (kind >= 0.08) & (kind < 0.15)  # exactly halfway between two TF32 values
    bits[tie] = (bits[tie] & np.uint32(0xFFFFE000)) | np.uint32(0x1000)
    return bits


def _run_mma(tmp_path: Path, a: np.ndarray, b: np.ndarray, c: np.ndarray, x: np.ndarray,
             arch: str, device_arch: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    tiles = a.shape[0]
    inp, out = tmp_path / f"in{arch}", tmp_path / f"out{arch}"
    with open(inp, "wb") as f:
        for arr in (a, b, c.view(np.uint32), x.view(np.uint32)):
            f.write(np.ascontiguousarray(arr).astype("<u4").tobytes())
    extra = ["--device-arch", device_arch] if device_arch else []
    res = run_emu("--arch", arch, *extra, "--program", str(SELFTEST / "mma.cu"), "--",
                  str(inp), str(out), str(tiles), str(x.size))
    assert res.returncode == 0, _fail_message(res)
    raw = np.fromfile(out, dtype="<u4")
    d = raw[:tiles * 128].view(np.float32).reshape(tiles, 16, 8)
    y = raw[tiles * 128:tiles * 128 + x.size]
    split = raw[tiles * 128 + x.size:].reshape(x.size, 2)
    return d, y, split


MODELS = {"80": (24, 4, -132), "86": (24, 4, -132), "89": (24, 4, -132), "90": (25, 8, -133)}


@pytest.fixture(scope="module")
def mma_inputs():
    rng = np.random.default_rng(1234)
    tiles = 24
    a = _random_operands(rng, tiles * 128, 12).reshape(tiles, 16, 8)
    b = _random_operands(rng, tiles * 64, 12).reshape(tiles, 8, 8)
    c = _random_operands(rng, tiles * 128, 20).view(np.float32).reshape(tiles, 16, 8)
    # Cancellation: C = -(A B) rounded, so the result is the rounding residue.
    exact = a.view(np.float32).astype(np.float64) @ b.view(np.float32).astype(np.float64)
    c[:4] = (-exact[:4]).astype(np.float32)
    x = _random_operands(rng, 4000, 60).view(np.float32)
    specials = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x7F7FFFFF, 0x7F7FF000,
                         0x00000001, 0x80001000, 0x3F801000, 0x3F803000, 0xBF801000],
                        dtype=np.uint32).view(np.float32)
    return a, b, c, np.concatenate([x, specials])


@pytest.mark.parametrize("arch,device_arch", [("80", None), ("80", "86"), ("90", None)])
def test_emulated_tf32_mma_and_cvt_match_an_exact_reference(tmp_path, mma_inputs, arch,
                                                            device_arch):
    a, b, c, x = mma_inputs
    d, y, _ = _run_mma(tmp_path, a, b, c, x, arch, device_arch)
    F, L, e_zero = MODELS[device_arch or arch]
    mismatches = []
    for t in range(a.shape[0]):
        for i in range(16):
            for j in range(8):
                want = reference_mma_element([int(v) for v in a[t, i]], [int(v) for v in b[t, :, j]],
                                             float(c[t, i, j]), F, L, e_zero)
                got = float(d[t, i, j])
                if np.float32(want).view(np.uint32) != np.float32(got).view(np.uint32):
                    mismatches.append((t, i, j, want, got))
    assert not mismatches, f"{len(mismatches)} of {d.size} mma outputs differ: {mismatches[:5]}"
    # The model is also close to float64: within the truncation bound of
    # 2 chunks x (9 terms x 2^(e_max - F) + rounding) relative to the largest
    # term, well below 2^-17.
    a64 = (a & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    b64 = (b & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    exact = a64 @ b64 + c.astype(np.float64)
    scale = np.maximum(np.abs(a64)[:, :, :, None] * np.abs(b64)[:, None, :, :], 0).max(axis=2)
    scale = np.maximum(scale, np.abs(c.astype(np.float64)))
    assert np.all(np.abs(d - exact) <= scale * 2.0 ** -17 + 1e-37)
    want_y = [reference_cvt_rna_tf32(int(v)) for v in x.view(np.uint32)]
    bad = [(hex(int(v)), hex(w), hex(int(g))) for v, w, g in zip(x.view(np.uint32), want_y, y)
           if w != int(g)]
    assert not bad, f"cvt.rna.tf32 differs on {len(bad)} of {x.size} values: {bad[:5]}"


def test_the_finite_tf32_split_rounds_big_as_cvt_rna_and_keeps_the_exact_rest(tmp_path, mma_inputs):
    """SplitTf32Finite (ecoc_tf32.cuh), which the kernels use for u and the
    codes, against the independent cvt.rna reference: big = tf32(x) for
    finite x, rounding ties away from zero and carrying into the exponent,
    up to infinity past the largest TF32 value; small = x - big exactly, a
    float32 left unrounded (the tensor cores ignore its low 13 bits, as the
    emulated mma does), and so x == big + small. A NaN does not survive in
    big (why the probabilities keep cvt.rna)."""
    _, _, _, x = mma_inputs
    edges = np.array([0x00000000, 0x80000000, 0x00001000, 0x00000FFF, 0x80001000,  # subnormal ties
                      0x3FFFF000, 0xBFFFF000, 0x3FFFEFFF,  # ties carrying into the exponent
                      0x7F7FE000, 0x7F7FEFFF, 0x7F7FF000, 0x7F7FFFFF, 0xFF7FF000,  # up to FLT_MAX
                      0x7FFFFFFF], dtype=np.uint32)
    values = np.concatenate([x.view(np.uint32), edges])
    *_, split = _run_mma(tmp_path, np.zeros((1, 16, 8), np.uint32), np.zeros((1, 8, 8), np.uint32),
                         np.zeros((1, 16, 8), np.float32), values.view(np.float32), "90")
    finite = np.isfinite(values.view(np.float32))
    bad = []
    inexact = 0
    for v, (big, small) in zip(values[finite], split[finite]):
        want_big = reference_cvt_rna_tf32(int(v))
        xv = np.uint32(v).view(np.float32)
        rest = np.float32(xv - np.uint32(want_big).view(np.float32))
        want_small = int(rest.view(np.uint32))
        if (int(big), int(small)) != (want_big, want_small):
            bad.append((hex(int(v)), hex(int(big)), hex(want_big), hex(int(small)), hex(want_small)))
        elif np.isfinite(rest):
            # The rest is exact: big + small gives x back in float64.
            inexact += float(np.uint32(big).view(np.float32)) + float(rest) != float(xv)
    assert finite.sum() >= 4000 and not bad, f"{len(bad)} of {finite.sum()} differ: {bad[:5]}"
    assert inexact == 0
    # About a quarter of these operands (1,007 of 4,020) keep bits below
    # TF32's in the rest: the rounding a TF32 small half would have had is
    # left to the tensor cores' truncation.
    assert np.count_nonzero(split[finite][:, 1] & 0x1FFF) > finite.sum() // 8
    # FLT_MAX's neighbourhood rounds to infinity and leaves -inf as the rest.
    assert tuple(split[values == 0x7F7FF000][0]) == (0x7F800000, 0xFF800000)
    # The canonical NaN wraps past the sign bit in big (-0); the rest is a NaN.
    big, small = split[values == 0x7FFFFFFF][0]
    assert big == 0x80000000 and np.isnan(np.uint32(small).view(np.float32))


def test_the_fast_softmax_exp_keeps_its_error_bound_and_flushes_tiny_results(tmp_path):
    """SoftmaxExp<kMath3xTf32> (ecoc_common.cuh), the tensor-core modes' exp:
    2^(x log2 e) by ex2.approx.ftz. Against float64 exp its relative error
    stays within the bound its comment states for the emulated model, 2^-23 |x| for the
    roundings of log2 e and of x log2 e plus one float32 rounding (the card
    adds MUFU's ~2 ulp, which the emulator does not model); a result below
    2^-126 is +0 where expf (SoftmaxExp<kMathFp32>) gives a subnormal; -inf
    gives 0 and NaN stays NaN in both."""
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(-17.0, 0.0, 3000), rng.uniform(-87.0, -17.0, 500),
                        [0.0, -0.0, -1e-30, -87.3, -87.4, -88.0, -100.0, -103.0, -np.inf, np.nan]])
    x = x.astype(np.float32)
    inp, out = tmp_path / "x", tmp_path / "y"
    x.astype("<f4").tofile(inp)
    res = run_emu("--arch", "90", "--program", str(SELFTEST / "softmax_exp.cu"), "--",
                  str(inp), str(out), str(x.size))
    assert res.returncode == 0, _fail_message(res)
    raw = np.fromfile(out, dtype="<f4")
    fast, accurate = raw[:x.size], raw[x.size:]
    ref = np.exp(x.astype(np.float64))
    normal = np.isfinite(x) & (ref >= 2.0 ** -126)
    rel = np.abs(fast[normal] - ref[normal]) / ref[normal]
    bound = 2.0 ** -23 * np.abs(x[normal].astype(np.float64)) + 2.0 ** -23
    assert np.all(rel <= bound), f"worst {np.max(rel / bound):.2f} x the bound"
    # The bound is not slack: the roundings show at large |x|, above half of it.
    assert np.max(rel / bound) > 0.5
    # expf stays within 2 ulp everywhere the fast form is normal.
    assert np.all(np.abs(accurate[normal] - ref[normal]) / ref[normal] <= 2.0 ** -22)
    tiny = np.isfinite(x) & (ref < 2.0 ** -126)
    assert tiny.sum() >= 3 and np.all(fast[tiny] == 0.0)
    assert np.all(accurate[tiny] > 0.0) and np.all(accurate[tiny] < 2.0 ** -126)
    assert fast[x == -np.inf][0] == 0.0 and accurate[x == -np.inf][0] == 0.0
    assert np.isnan(fast[np.isnan(x)][0]) and np.isnan(accurate[np.isnan(x)][0])


def test_emulated_ldmatrix_gives_each_lane_the_words_plain_loads_give_and_checks_addresses(
        tmp_path):
    """ptx::ldmatrix_x4 / _x2 on 32-bit words (emu/selftest/ldmatrix.cu): over
    64 trials of pitches and row starts, lane l's register j equals a plain
    shared load of word l % 4 of row l / 4 of matrix j, the property that
    lets the mma kernels load fragments with it and keep their bits. A row
    address off a 16-byte boundary, or past the block's shared memory,
    aborts the launch as it would fault on a card."""
    out = tmp_path / "out"
    res = run_emu("--arch", "90", "--program", str(SELFTEST / "ldmatrix.cu"), "--", str(out), "ok")
    assert res.returncode == 0, _fail_message(res)
    bad, compared = np.fromfile(out, dtype="<u4")
    assert compared == 64 * 32 * 6 and bad == 0
    for mode, lane, words in (("misaligned", 5, "not 16-byte aligned"),
                              ("outside", 9, "outside the block's")):
        res = run_emu("--arch", "90", "--program", str(SELFTEST / "ldmatrix.cu"), "--",
                      str(tmp_path / mode), mode)
        assert res.returncode != 0
        assert "ldmatrix.x4" in res.stderr and f"thread {lane} reads" in res.stderr, res.stderr
        assert words in res.stderr, res.stderr


def test_emulated_wgmma_matches_an_exact_reference_and_retires_products_at_the_wait(tmp_path):
    """ptx::wgmma_tf32<N> (emu/selftest/wgmma.cu) in the four layouts the
    wgmma kernels use (N = 64 at LBO 128 / SBO 4096 bytes, N = 128 and 32
    at 144 / 2304: the forward; N = 32 at 128 / 2048: the codes gradient's
    w tile), two k-steps through an advanced descriptor, on small
    integers: exact, so the result must equal the reference bit for bit.
    The emulator runs a product when the wait that retires it runs: reading
    the accumulators before the wait reads NaN, and a store into B between
    the issue and the wait changes the product. Below sm_90 the wrappers
    abort, as the card would trap."""
    out = tmp_path / "out"
    program = ("--program", str(SELFTEST / "wgmma.cu"), "--")
    res = run_emu("--arch", "90", *program, str(out), "ok")
    assert res.returncode == 0, _fail_message(res)
    bad, compared = np.fromfile(out, dtype="<u4")
    assert compared == 64 * (64 + 128 + 32 + 32) and bad == 0
    # Row 0 of B zeroed before the wait: column 0 of D, 64 outputs per case.
    for mode, wrong in (("read-before-wait", compared), ("store-before-wait", 4 * 64)):
        res = run_emu("--arch", "90", *program, str(tmp_path / mode), mode)
        assert res.returncode == 1, _fail_message(res)
        assert np.fromfile(tmp_path / mode, dtype="<u4")[0] == wrong, res.stdout
    res = run_emu("--arch", "80", *program, str(tmp_path / "sm80"), "ok")
    assert res.returncode != 0 and "reached below sm_90" in res.stderr, res.stderr


def test_emulated_mma_on_special_values_follows_ieee_with_a_canonical_nan(tmp_path):
    def tile(av, bv, cv):
        a = np.zeros((1, 16, 8), np.float32)
        b = np.zeros((1, 8, 8), np.float32)
        c = np.zeros((1, 16, 8), np.float32)
        a[0, 0, 0], b[0, 0, 0], c[0, 0, 0] = av, bv, cv
        a[0, 0, 1], b[0, 1, 0] = 1.0, 1.0  # a finite term next to the special one
        return a, b, c
    cases = [(np.inf, 2.0, 1.0, np.inf), (np.inf, 0.0, 1.0, np.nan), (1.0, 1.0, -np.inf, -np.inf),
             (np.inf, 1.0, -np.inf, np.nan), (np.nan, 1.0, 0.0, np.nan), (-3.0, 1.0, 3.0, 1.0)]
    arrays = [tile(*cs[:3]) for cs in cases]
    a = np.concatenate([t[0] for t in arrays]).view(np.uint32)
    b = np.concatenate([t[1] for t in arrays]).view(np.uint32)
    c = np.concatenate([t[2] for t in arrays])
    d, _, _ = _run_mma(tmp_path, a, b, c, np.zeros(0, np.float32), "90")
    for t, (_, _, _, want) in enumerate(cases):
        got = d[t, 0, 0]
        if np.isnan(want):
            assert np.float32(got).view(np.uint32) == 0x7FFFFFFF, (cases[t], got)
        else:
            assert got == want, (cases[t], got)


def test_emulated_mma_is_bit_exact_against_mmasim(tmp_path, mma_inputs):
    torch = pytest.importorskip("torch")
    mmasim_nv = pytest.importorskip("mmasim.nv_ptx")
    a, b, c, _ = mma_inputs
    for arch, name in (("80", "Ampere"), ("90", "Hopper")):
        d, _, _ = _run_mma(tmp_path, a, b, c, np.zeros(0, np.float32), arch)
        op = mmasim_nv.MMA(name, "m16n8k8.f32.tf32.tf32.f32")
        for t in range(a.shape[0]):
            ref = op(torch.from_numpy(a[t].view(np.float32).copy()),
                     torch.from_numpy(b[t].view(np.float32).copy()),
                     torch.from_numpy(c[t].copy())).numpy()
            diff = np.flatnonzero(ref.view(np.uint32) != d[t].view(np.uint32))
            assert diff.size == 0, (f"{name}: tile {t}, {diff.size} outputs differ from mmasim, "
                                    f"first {ref.flat[diff[0]]!r} vs {d[t].flat[diff[0]]!r}")


# SHA-256 of the dump of selftest/mma_random.cu on an NVIDIA H100 80GB HBM3
# (driver 580.159.04, nvcc 13.0, -arch=sm_90), 2026-11-26: the inputs (A, B,
# C, x) and the results (512 mma tiles = 65536 outputs, 65536 cvt values).
H100_MMA_RANDOM_INPUTS = "bd1ede737a4b51ebfe2c030b1bd749f330b052c096d3df4ab813f739c5c0a082"
H100_MMA_RANDOM_RESULTS = "1fa89e543a8602a5f5e38aa631cb0aa61b52bf2d42e100e9a4a007eca580eda9"


def test_emulated_sm90_mma_and_cvt_reproduce_a_real_h100_bit_for_bit(tmp_path):
    import hashlib

    dump = tmp_path / "mma_random.bin"
    env = dict(os.environ, R=str(dump))
    res = subprocess.run([sys.executable, str(RUN), "--arch", "90", "--program",
                          str(SELFTEST / "mma_random.cu")],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, _fail_message(res)
    data = dump.read_bytes()
    split = (512 * 320 + 65536) * 4
    assert hashlib.sha256(data[:split]).hexdigest() == H100_MMA_RANDOM_INPUTS
    assert hashlib.sha256(data[split:]).hexdigest() == H100_MMA_RANDOM_RESULTS
