"""The GPU-run plumbing without a GPU: benchmarks/device_run.sh (its dry run
and budget; the whole run on stand-ins for nvidia-smi, nvcc and
compute-sanitizer), `bench_streaming.py --device gpu`, benchmarks/bench_gpu_loss.py
(its simulated GPU path against a float64 NumPy reference, the harness JSON
merge, worker crashes and hangs, its cell and method order and the cap of a
slow method), the wheel list, the DEVICE_CHECK_T_* step limits of
kernels/cuda/device_check.sh, and benchmarks/device_run_backends.sh (its dry
run, and its status phase with benchmarks/device_fused_check.py: a fused call
that raises fails it).

The numbers themselves need a GPU machine; these tests pin down what must hold
anywhere: a missing GPU is said in one clear line (no traceback), every phase
gets a summary row, the GPU run never touches docs/benchmarks.md, bad limits
are refused. Backend-independent, so they run on the TensorFlow pass only.
"""

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script

import keras

REPO = Path(__file__).resolve().parents[1]
DEVICE_CHECK = REPO / "kernels" / "cuda" / "device_check.sh"
DEVICE_RUN = REPO / "benchmarks" / "device_run.sh"
BENCH = REPO / "benchmarks" / "bench_streaming.py"
GPU_LOSS = REPO / "benchmarks" / "bench_gpu_loss.py"
WHEELS_SH = REPO / "benchmarks" / "device_wheels.sh"
WHEEL_LIST = REPO / "benchmarks" / "device_wheels.txt"

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="backend-independent scripts: run once, on the TF pass")


def _no_gpu_or_skip():
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine may have a GPU: run benchmarks/device_run.sh itself")


class _Background:
    """A subprocess started ahead of the test that reads it (by a module
    fixture, next to another one: each of these runs is one Python process
    after another, so two side by side take about the time of one on 2
    cores). Its output goes to files, not pipes, so it never blocks on a
    full pipe while the test waits on the other run."""

    def __init__(self, cmd, env, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.cmd = folder, cmd
        with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)

    def result(self, timeout: float) -> subprocess.CompletedProcess:
        """Waits at most `timeout` s from now (the run started earlier)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise
        return subprocess.CompletedProcess(self.cmd, self.proc.returncode,
                                           (self.folder / "stdout").read_text(),
                                           (self.folder / "stderr").read_text())

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def _started(tmp_path_factory, starts):
    """Starts start(folder) -> (cmd, env) of each entry of `starts` (key ->
    start), all at once, each in its own folder; gives key -> _Background and
    kills what still runs on the way out."""
    runs = {}
    try:
        for key, start in starts.items():
            folder = tmp_path_factory.mktemp("background")
            runs[key] = _Background(*start(folder), folder)
        yield runs
    finally:
        for run in runs.values():
            run.close()


def _side_by_side(request, tmp_path_factory, test_name, param, start):
    """Starts start(value, folder) -> (cmd, env) for each value of `param` that
    the session selected of `test_name`, all at once; yields value -> _Background."""
    values = [item.callspec.params[param] for item in request.session.items
              if item.module is request.module and item.originalname == test_name]
    with _started(tmp_path_factory,
                  {value: functools.partial(start, value) for value in values}) as runs:
        yield runs


def test_device_check_takes_step_limits_from_the_environment():
    env = dict(os.environ, DEVICE_CHECK_T_GRID="60", DEVICE_CHECK_T_BUILD="45")
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--dry-run"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "step grid (<= 60 s)" in proc.stdout and "step build (<= 45 s)" in proc.stdout
    assert "step checks (<= 20 s)" in proc.stdout  # the default where none is given


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5"])
def test_device_check_rejects_a_step_limit_that_is_not_a_positive_integer(value):
    env = dict(os.environ, DEVICE_CHECK_T_MEMCHECK=value)
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--dry-run"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 3
    assert "DEVICE_CHECK_T_MEMCHECK must be a positive integer" in proc.stderr
    assert f"Received: DEVICE_CHECK_T_MEMCHECK={value}" in proc.stderr


def test_device_run_script_parses():
    assert os.access(DEVICE_RUN, os.X_OK), "device_run.sh must be executable"
    proc = subprocess.run(["bash", "-n", str(DEVICE_RUN)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_bench_rejects_an_unknown_backend():
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "gpu", "--backends", "tf"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Argument `--backends` must be a comma-separated subset of jax,torch" in proc.stderr


def _no_gpu_run(folder):
    env = dict(os.environ, OUT=str(folder / "out"), PYTHON=sys.executable,
               WHEEL_DIR=str(folder / "none"), SITE_DIR=str(folder / "site"), JAX_PLATFORMS="cpu",
               DEVICE_RUN_IMPORT_LIMIT="150")  # a loaded 2-core machine, not the GPU one
    return ["bash", str(DEVICE_RUN)], env


def _fake_tools(bin_dir: Path) -> Path:
    """Writes the stand-ins for nvidia-smi, nvcc and compute-sanitizer into bin_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("nvidia-smi", _FAKE_NVIDIA_SMI), ("nvcc", _FAKE_NVCC),
                       ("compute-sanitizer", _FAKE_SANITIZER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _prebuild(folder: Path, nvcc: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DEVICE_CHECK), "--prebuild", str(folder)],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, NVCC=str(nvcc)))


def _fake_gpu_run(folder):
    bin_dir = _fake_tools(folder / "bin")
    # The harness prebuilt as benchmarks/device_wheels.sh does (with the same
    # stand-in nvcc, so that its stamp matches): the build step copies it.
    assert _prebuild(folder / "prebuilt", bin_dir / "nvcc").returncode == 0
    cmd, env = _no_gpu_run(folder)
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               DEVICE_CHECK_PREBUILT_DIR=str(folder / "prebuilt"),
               COMPUTE_SANITIZER=str(bin_dir / "compute-sanitizer"),
               ECOC_HARNESS_JSON=str(folder / "harness" / "timing.json"),
               DEVICE_RUN_STREAMING_MIN="100000",
               DEVICE_RUN_GPULOSS_ARGS="--simulate-gpu --methods jax_default --reps 1 "
                                       "--block-ms 1 --assume-card NVIDIA_H100")
    return cmd, env


@pytest.fixture(scope="module")
def _device_runs(request, tmp_path_factory):
    """The two whole runs of device_run.sh below (no GPU; a fake GPU), started
    at once (each runs its phases' Python processes one after another), with
    docs/benchmarks.md as it was before either started: name -> _Background."""
    names = {item.originalname for item in request.session.items if item.module is request.module}
    docs_before = (REPO / "docs" / "benchmarks.md").read_bytes()
    starts = {start.__name__: start
              for test, start in (("test_device_run_without_a_gpu_reports_every_phase_and_exits_"
                                   "zero", _no_gpu_run),
                                  ("test_device_run_on_a_fake_gpu_merges_the_harness_rows_into_"
                                   "the_loss_table", _fake_gpu_run))
              if test in names and not (start is _no_gpu_run and shutil.which("nvidia-smi"))}
    with _started(tmp_path_factory, starts) as runs:
        yield runs, docs_before


@pytest.mark.slow
def test_device_run_without_a_gpu_reports_every_phase_and_exits_zero(_device_runs):
    # About 20 s on 2 cores: two keras imports and the benchmark's probe (side by
    # side with the fake-GPU run below).
    _no_gpu_or_skip()
    docs = REPO / "docs" / "benchmarks.md"
    runs, docs_before = _device_runs
    run = runs["_no_gpu_run"]
    out = run.folder / "out"
    proc = run.result(timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (out / "summary.md").read_text()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1]
            for line in summary.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows == {"phase": "status", "info": "pass", "wheels": "FAIL", "import-jax": "pass",
                    "import-torch": "pass", "kernels": "NO GPU", "gpuloss": "NO GPU",
                    "bench": "NO GPU"}, summary
    log = (out / "device_run.log").read_text()
    assert "no wheels in" in log
    assert len(list(out.iterdir())) <= 8  # what the device tool returns at most
    # The bench phase is `bench_streaming.py --device gpu` run from the repository
    # root (checked here rather than in a run of its own, which cost ~40 s more): it
    # says in one line that there is no GPU, exits 2 with no traceback, writes its
    # "nothing measured" table and JSON, and leaves docs/benchmarks.md alone.
    bench_log = log[log.index("## phase bench "):log.index("## phase bench: ")]
    assert "(exit 2)" in log[log.index("## phase bench: "):].splitlines()[0]
    assert "Traceback" not in bench_log
    assert "bench_streaming --device gpu: no GPU for any of --backends=jax,torch" in bench_log
    text = (out / "bench_streaming_gpu.md").read_text()
    assert text.startswith("<!-- bench_streaming_gpu:begin -->") and "no GPU: nothing measured" in text
    state = json.loads((out / "bench_streaming_gpu.json").read_text())
    assert state["grid"] == [] and state["status"] == "no GPU: nothing measured"
    assert docs.read_bytes() == docs_before


# --- device_run.sh --dry-run: the 8-minute plan -----------------------------------

def _dry_run(**env):
    # No prebuilt harness unless the caller names one: the answer must not
    # depend on what this checkout's .whl/ holds.
    env.setdefault("WHEEL_DIR", "/nonexistent/keras-ecoc-wheels")
    proc = subprocess.run(["bash", str(DEVICE_RUN), "--dry-run"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, **env))
    assert proc.returncode == 0, proc.stderr
    phases = re.findall(r"^phase (\S+) \(<= (\d+) s, starts by (\d+) s\)", proc.stdout, re.M)
    steps = re.findall(r"^  step (\S+) \(<= (\d+) s\)", proc.stdout, re.M)
    return proc.stdout, [(n, int(lim), int(at)) for n, lim, at in phases], \
        {n: int(lim) for n, lim in steps}


@pytest.fixture(scope="module")
def _prebuilt(tmp_path_factory):
    """A harness prebuilt with the stand-in nvcc: (its folder, the env that finds it)."""
    folder = tmp_path_factory.mktemp("prebuilt")
    bin_dir = _fake_tools(folder / "bin")
    proc = _prebuild(folder / "whl", bin_dir / "nvcc")
    assert proc.returncode == 0, proc.stderr
    return folder / "whl", {"WHEEL_DIR": str(folder / "whl"), "NVCC": str(bin_dir / "nvcc")}


def test_device_run_dry_run_fits_eight_minutes_even_when_every_phase_runs_to_its_limit():
    out, phases, steps = _dry_run()
    assert [p[0] for p in phases] == ["info", "wheels", "import-jax", "import-torch", "kernels",
                                      "gpuloss"]
    assert "phase bench: SKIPPED" in out  # no time left in the worst case
    end = max(lim + at for _, lim, at in phases)
    assert end <= 465 and end + 15 <= 480  # +15: the last phase's kill margin
    kernels = dict((n, lim) for n, lim, _ in phases)["kernels"]
    assert set(steps) == {"build", "ldmatrix", "wgmma", "checks", "grid", "smem-limit", "memcheck",
                          "racecheck", "bench", "ncu", "ncu-codes-grad"}
    assert sum(steps.values()) <= kernels - 10  # device_check.sh finishes, writes its table
    assert dict((n, lim) for n, lim, _ in phases)["gpuloss"] >= 100
    files = out.splitlines()[0].rsplit(": ", 1)[1].split()
    assert len(files) == 8 and "bench_gpu_loss.md" in files and "device_check.md" in files


def test_device_run_dry_run_gives_the_grid_more_time_with_a_longer_budget_and_honours_overrides():
    _, _, short = _dry_run()
    _, phases, steps = _dry_run(DEVICE_RUN_BUDGET="900", DEVICE_CHECK_T_MEMCHECK="33")
    assert steps["grid"] == 115 and steps["build"] == 95 and steps["memcheck"] == 33
    assert short["grid"] < steps["grid"]
    assert dict((n, lim) for n, lim, _ in phases)["kernels"] == 490  # device_check.sh's defaults (480) + 10


def test_device_run_gives_the_kernel_steps_what_the_gpus_measured_when_earlier_phases_are_typical(
        _prebuilt):
    # On the H100 of 2026-11-26 the phases before kernels took 34 s of the 465 s
    # budget (37 s on the H200 of 2026-11-27), leaving 431 s; the dry run charges
    # the earlier phases their 110 s of limits, so a budget of 431 + 110 s shows
    # that plan. With the prebuilt harness, what the H100 and H200 of 2026-11-27
    # measured must fit: the grid (92 s), the timings of every launch variant
    # (53-54 s with 12 variants; about 70 s with today's 15 and the decode
    # table), the checks (10 s), racecheck (32 s on the H200, more on the H100)
    # and the profiles (23 s and 8 s).
    _, env = _prebuilt
    out, _, steps = _dry_run(DEVICE_RUN_BUDGET=str(431 + 110), **env)
    assert "kernels: prebuilt: match" in out
    assert steps["grid"] >= 95 and steps["bench"] >= 75 and steps["checks"] >= 12
    assert steps["racecheck"] >= 45 and steps["ncu"] >= 26 and steps["ncu-codes-grad"] >= 13
    assert steps["build"] >= 5 and "install -m 755" in out
    # Without it the harness compiles (73 s on the H200): the build keeps what
    # it needs, the others share the rest, and the dry run says how to avoid it.
    out, _, steps = _dry_run(DEVICE_RUN_BUDGET=str(431 + 110))
    assert steps["build"] >= 80 and "-o " in out
    assert "the harness is compiled on the device" in out


def test_device_check_prebuild_writes_a_stamped_harness_that_another_tree_or_nvcc_makes_stale(
        _prebuilt, tmp_path):
    whl, env = _prebuilt
    assert (whl / "ecoc_harness_sm90").stat().st_mode & 0o111
    stamp = (whl / "ecoc_harness_sm90.stamp").read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", stamp)

    def status(**extra):
        run_env = dict(os.environ, **{"DEVICE_CHECK_PREBUILT_DIR": str(whl), "NVCC": env["NVCC"],
                                      **extra})
        proc = subprocess.run(["bash", str(DEVICE_CHECK), "--prebuilt-status"], capture_output=True,
                              text=True, timeout=60, env=run_env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert status() == f"prebuilt: match {whl / 'ecoc_harness_sm90'}"
    # Another compiler: the stamp no longer describes what it would build.
    other = tmp_path / "nvcc"
    other.write_text(Path(env["NVCC"]).read_text().replace("Build fake_13.0", "Build fake_13.1"))
    other.chmod(0o755)
    assert "is stale" in status(NVCC=str(other))
    # Other sources (a stamp from another tree), or no binary at all.
    copy = tmp_path / "whl"
    shutil.copytree(whl, copy)
    (copy / "ecoc_harness_sm90.stamp").write_text("0" * 64 + "\n")
    assert "is stale" in status(DEVICE_CHECK_PREBUILT_DIR=str(copy))
    assert status(DEVICE_CHECK_PREBUILT_DIR=str(tmp_path / "empty")).startswith("prebuilt: none (no ")
    # A bad command line is refused before anything is built.
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--prebuild"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3 and "--prebuild needs a folder" in proc.stderr
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--prebuild", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, NVCC=env["NVCC"], DEVICE_CHECK_ARCH="9.0"))
    assert proc.returncode == 3 and "Received: DEVICE_CHECK_ARCH=9.0" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_device_run_rejects_an_unknown_argument():
    proc = subprocess.run(["bash", str(DEVICE_RUN), "--wet-run"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 3 and "unknown argument '--wet-run'" in proc.stderr


# --- the wheel list -----------------------------------------------------------------

def _wheel_specs():
    specs = []
    for line in WHEEL_LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            spec, source = line.split()
            specs.append((spec, source))
    return specs


def test_wheel_list_pins_one_version_of_each_package_the_gpu_run_imports():
    specs = _wheel_specs()
    names = [s.split("==")[0] for s, _ in specs]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[a-z0-9-]+==[0-9][0-9.]*", s) for s, _ in specs)
    # keras (import phases, bench_streaming) and the two competitors of bench_gpu_loss.
    assert {"keras", "cut-cross-entropy", "liger-kernel"} <= set(names)
    cce = dict(specs)["cut-cross-entropy==25.6.4"]
    assert re.fullmatch(r"git:apple/ml-cross-entropy@[0-9a-f]{40}", cce)  # PyPI's lacks `bias`
    assert ".whl/" in (REPO / ".gitignore").read_text()


def test_device_wheels_dry_run_fetches_every_listed_wheel():
    proc = subprocess.run(["bash", str(WHEELS_SH), "--dry-run", "/nonexistent/mirror"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    for spec, source in _wheel_specs():
        if source == "pypi":
            assert re.search(rf"pip download .*--python-version 3\.12 .* {re.escape(spec)}$",
                             proc.stdout, re.M), spec
    commit = dict(_wheel_specs())["cut-cross-entropy==25.6.4"].split("@")[1]
    assert f"git -C /nonexistent/mirror archive {commit}" in proc.stdout
    assert "pip wheel -q --no-deps --no-build-isolation" in proc.stdout


# --- bench_gpu_loss.py ------------------------------------------------------------------

def _gpu_loss_module():
    return load_script(GPU_LOSS, "bench_gpu_loss")


def _harness_rows(cells):
    # The 3xTF32 rows timed in blocks of back-to-back calls too (as the
    # harness does for its traced columns), the TF32 rows in single calls.
    return [{"B": b, "k": k, "n": n, "mode": mode, "fwd_ms": 0.5 * f, "fwdbwd_ms": f,
             "peak_bytes": 4 * (b * k + n * k),
             **({"fwd_block_ms": 0.4 * f, "fwdbwd_block_ms": 0.8 * f} if mode == "3xtf32" else {})}
            for b, k, n in cells for mode, f in (("3xtf32", 2.0), ("tf32", 1.0))]


def _float64_reference(z, codes, labels, scale):
    """Loss, dz, dM of the ECOC loss in float64 NumPy (independent of the script)."""
    z, m = z.astype(np.float64), codes.astype(np.float64)
    b = z.shape[0]
    nz = np.linalg.norm(z, axis=1, keepdims=True)
    u = z / nz
    logits = scale * u @ m.T - 0.5 * scale * (m * m).sum(1) - 0.5 * scale
    top = logits.max(1, keepdims=True)
    p = np.exp(logits - top)
    lse = np.log(p.sum(1)) + top[:, 0]
    p /= p.sum(1, keepdims=True)
    loss = np.mean(lse - logits[np.arange(b), labels])
    g = p.copy()
    g[np.arange(b), labels] -= 1.0
    g /= b
    dm = scale * g.T @ u - scale * g.sum(0)[:, None] * m
    du = scale * g @ m
    dz = (du - (du * u).sum(1, keepdims=True) * u) / nz
    return loss, dz, dm


@pytest.mark.slow
def test_bench_gpu_loss_simulated_rows_match_a_float64_reference_and_merge_the_harness(tmp_path):
    # About 30 s on 2 cores: a JAX and a PyTorch worker on the CPU, tiny shapes.
    mod = _gpu_loss_module()
    harness = tmp_path / "harness.json"
    harness.write_text(json.dumps(_harness_rows(mod.QUICK_GRID)))
    out = tmp_path / "gl.md"
    proc = subprocess.run(
        [sys.executable, str(GPU_LOSS), "--simulate-gpu", "--compile-backend", "eager",
         "--methods", "jax_default,jax_highest,torch_compile,cce_exact,liger", "--reps", "1",
         "--block-ms", "1", "--assume-card", "NVIDIA H200", "--harness-json", str(harness),
         "--time-limit", "240", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = json.loads((tmp_path / "gl.json").read_text())
    assert state["skipped"] == []
    rows = {(r["method"], r["B"], r["k"], r["n"]): r for r in state["rows"]}
    # "complete" only when no row was skipped (CCE and Liger need Triton, which
    # only the GPU machine has).
    skipped_rows = any(r.get("skipped") for r in state["rows"])
    assert state["status"] == ("finished; see 'Not measured' and the skipped rows"
                               if skipped_rows else "complete"), state["status"]
    for b, k, n in mod.QUICK_GRID:
        z, codes, labels = mod.problem(b, k, n)
        loss, dz, dm = _float64_reference(z, codes, labels, mod.SCALE)
        want = {"loss": loss, "dz_norm": np.linalg.norm(dz), "dm_norm": np.linalg.norm(dm),
                "dz_proj": np.sum(dz * z[:, ::-1]), "dm_proj": np.sum(dm * codes[:, ::-1])}
        ref = rows[("ref", b, k, n)]
        for key, v in want.items():
            assert ref[key] == pytest.approx(v, rel=1e-9, abs=1e-12), (key, b, k, n)
        for method in ("jax_default", "jax_highest", "torch_compile"):
            r = rows[(method, b, k, n)]
            assert "error" not in r, r
            assert r["loss"] == pytest.approx(loss, rel=2e-6)
            for g, gn in (("dz", np.linalg.norm(dz)), ("dm", np.linalg.norm(dm))):
                assert abs(r[f"{g}_norm"] - want[f"{g}_norm"]) <= 1e-5 * gn
                # The projection on the flipped input pins the direction down.
                p = np.linalg.norm(z if g == "dz" else codes)
                assert abs(r[f"{g}_proj"] - want[f"{g}_proj"]) <= 1e-5 * gn * p
            assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0
        for method in ("cce_exact", "liger"):  # need Triton: on the GPU machine only
            r = rows[(method, b, k, n)]
            assert "error" not in r, r
            assert "not importable" in r.get("skipped", "") or r["fwdbwd_ms"] > 0, r
    text = out.read_text()
    assert text.startswith(mod.BEGIN) and text.rstrip().endswith(mod.END)
    assert "SIMULATED" in text and "H200 SXM: FP32 67 TFLOP/s, TF32 dense 495" in text
    assert text.count("| keras-ecoc CUDA, 3xtf32 | fp32 | 0.8 | 1.600 |") == len(mod.QUICK_GRID)
    assert text.count("| keras-ecoc CUDA, tf32 (single calls) | tf32 | 0.5 | 1.000 |") == len(
        mod.QUICK_GRID)
    assert "### Issue 16's targets" in text
    assert len(state["harness_rows"]) == 2 * len(mod.QUICK_GRID)
    # Re-rendering the saved run (no GPU) gives the same table.
    again = tmp_path / "again.md"
    proc = subprocess.run([sys.executable, str(GPU_LOSS), "--render", str(tmp_path / "gl.json"),
                           "--out", str(again)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    strip = re.compile(r"on \d{4}-\d\d-\d\d \d\d:\d\d UTC")
    assert strip.sub("", again.read_text()) == strip.sub("", text)


@pytest.fixture(scope="module")
def _faulty_gpu_loss_runs(request, tmp_path_factory):
    """The crash and the hang case of the test below, started side by side:
    the crash case runs while the hang case waits out its item timeout."""
    def start(fault, folder):
        return ([sys.executable, str(GPU_LOSS), "--simulate-gpu", "--methods",
                 "jax_default,jax_highest", "--no-reference", "--reps", "1", "--block-ms", "1",
                 "--item-timeout", "15", "--time-limit", "200", "--out", str(folder / "gl.md")],
                dict(os.environ, BENCH_GPU_LOSS_FAULT=f"{fault}:jax_highest:4"))

    yield from _side_by_side(request, tmp_path_factory,
                             "test_bench_gpu_loss_records_a_crashing_or_hanging_method_and_goes_on",
                             "fault", start)


@pytest.mark.slow
@pytest.mark.parametrize("fault,why", [("crash", "worker exited with code 3"),
                                       ("hang", "ran past --item-timeout=15 s")])
def test_bench_gpu_loss_records_a_crashing_or_hanging_method_and_goes_on(
        _faulty_gpu_loss_runs, fault, why):
    # About 20 s for both cases: the JAX worker restarts past the (method, cell)
    # that fails. An item here takes about a second (under 10 s on a loaded
    # machine), so 15 s is a hang.
    mod = _gpu_loss_module()
    run = _faulty_gpu_loss_runs[fault]
    out = run.folder / "gl.md"
    proc = run.result(timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = json.loads((run.folder / "gl.json").read_text())
    assert state["status"] == "finished with errors; see the table"
    rows = {(r["method"], r["B"], r["k"], r["n"]): r for r in state["rows"]}
    assert len(rows) == 2 * len(mod.QUICK_GRID)
    for b, k, n in mod.QUICK_GRID:
        assert rows[("jax_default", b, k, n)]["fwdbwd_ms"] > 0, rows[("jax_default", b, k, n)]
        if b == 4:
            assert why in rows[("jax_highest", b, k, n)]["error"]
        else:  # the cells after the failed one were measured by a restarted worker
            assert rows[("jax_highest", b, k, n)]["fwdbwd_ms"] > 0
    assert why in out.read_text()


def test_bench_gpu_loss_stops_at_the_time_limit_and_lists_what_it_skipped(tmp_path):
    out = tmp_path / "gl.md"
    proc = subprocess.run(
        [sys.executable, str(GPU_LOSS), "--simulate-gpu", "--methods", "jax_highest",
         "--no-reference", "--time-limit", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, BENCH_GPU_LOSS_FAULT="hang:jax_highest"))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]  # nothing measured
    state = json.loads((tmp_path / "gl.json").read_text())
    mod = _gpu_loss_module()
    assert len(state["skipped"]) == len(mod.QUICK_GRID)
    assert "not run, --time-limit reached (3): jax_highest B=" in out.read_text()


def test_harness_json_merges_into_the_table_and_the_targets():
    mod = _gpu_loss_module()
    cell = (256, 128, 100_000)
    state = {"status": "complete", "scale": 16.0, "reps": 5, "card": "NVIDIA H100 80GB HBM3",
             "probe": {}, "skipped": [], "notes": [], "elapsed_s": 60.0,
             "rows": [{"method": m, "B": cell[0], "k": cell[1], "n": cell[2], "fwd_ms": t / 3,
                       "fwdbwd_ms": t, "peak_bytes": 2**30}
                      for m, t in (("jax_default", 10.0), ("cce_exact", 6.0),
                                   ("cce_tf32", 3.0))]}
    harness = [{"method": "ecoc_cuda[3xtf32]", "mode": "3xtf32", "B": cell[0], "k": cell[1],
                "n": cell[2], "fwd_ms": 1.0, "fwdbwd_ms": 4.0, "peak_bytes": 2**20},
               {"method": "ecoc_cuda[tf32]", "mode": "tf32", "B": cell[0], "k": cell[1],
                "n": cell[2], "fwd_ms": 1.0, "fwdbwd_ms": 6.0, "peak_bytes": None}]
    text = mod.render(state, harness)
    # 6Bnk FLOPs in 4 ms = 4.9 TFLOP/s: 7.3 % of the H100 SXM's 67 (FP32), 1.0 % of 495
    # (TF32); the codes (n k 4 = 51 MB) once at 3.35 TB/s: 0.0153 ms.
    assert ("| 256 | 128 | 100,000 | keras-ecoc CUDA, 3xtf32 | fp32 | 1.000 | 4.000 | 1.0 | "
            "4.9 | 7.3 | 1.0 | 0.0153 | n/a | n/a |") in text
    # At n = 10^5 and B = 256 the target is half JAX DEFAULT's time; CCE at equal precision.
    assert ("| 3xtf32 | 4.000 | 0.40 (≤ 0.5: met) | 0.67 vs cce_exact: met | (B = 16 only) |"
            in text)
    assert "| tf32 | 6.000 | 0.60 (≤ 0.5: MISSED) | 2.00 vs cce_tf32: MISSED |" in text
    # Rows come in a fixed order: the CUDA kernels first, then JAX, then CCE.
    table = text.split("### Issue 16's targets")[0]
    order = [line.split(" | ")[3] for line in table.splitlines() if line.startswith("| 256 |")]
    assert order == ["keras-ecoc CUDA, 3xtf32", "keras-ecoc CUDA, tf32", "JAX jit, DEFAULT",
                     "CCE cce_exact, highest", "CCE cce_exact, high (TF32)"]


@pytest.mark.parametrize("content,why", [
    ('{"rows": []}', "a JSON dict"),
    ("[1]", "entry 0 is a int"),
    ('[{"B": 16, "k": 32, "n": 100, "mode": "fp32", "fwd_ms": 1.0}]',
     "entry 0 lacks fwdbwd_ms, peak_bytes"),
    ('[{"B": 0, "k": 32, "n": 100, "mode": "fp32", "fwd_ms": 1, "fwdbwd_ms": 2, '
     '"peak_bytes": 3}]', "B, k, n must be positive integers"),
    ('[{"B": 16, "k": 32, "n": 100, "mode": "", "fwd_ms": 1, "fwdbwd_ms": 2, "peak_bytes": 3}]',
     "mode must be a non-empty string"),
    ('[{"B": 16, "k": 32, "n": 100, "mode": "fp32", "fwd_ms": -1, "fwdbwd_ms": 2, '
     '"peak_bytes": 3}]', "fwd_ms must be a non-negative number or null"),
    ("[{", "JSONDecodeError"),
])
def test_harness_json_that_breaks_the_format_is_refused_naming_the_entry(tmp_path, content, why):
    mod = _gpu_loss_module()
    path = tmp_path / "h.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="Argument `--harness-json` must name a JSON list") as e:
        mod.load_harness_json(str(path))
    assert why in str(e.value) and f"Received: --harness-json={path}" in str(e.value)


def test_check_harness_json_command_accepts_nulls_and_refuses_a_bad_file(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps([{"B": 1, "k": 1, "n": 1, "mode": "fp32", "fwd_ms": None,
                                 "fwdbwd_ms": 0.25, "peak_bytes": None, "note": "x"}]))
    bad.write_text("[1]")
    ok = subprocess.run([sys.executable, str(GPU_LOSS), "--check-harness-json", str(good)],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "1 valid harness rows" in ok.stdout
    no = subprocess.run([sys.executable, str(GPU_LOSS), "--check-harness-json", str(bad)],
                        capture_output=True, text=True, timeout=60)
    assert no.returncode == 2 and "entry 0 is a int" in no.stderr


@pytest.mark.parametrize("name,peaks", [
    ("NVIDIA H100 80GB HBM3", ("H100 SXM", 67.0, 495.0, 3.35)),
    ("NVIDIA H100 PCIe", ("H100 PCIe", 51.0, 378.0, 2.0)),
    ("NVIDIA H100 NVL", ("H100 NVL", 60.0, 418.0, 3.9)),
    ("NVIDIA H200", ("H200 SXM", 67.0, 495.0, 4.8)),
    ("NVIDIA H200 NVL", ("H200 NVL", 60.0, 418.0, 4.8)),
    ("NVIDIA A100-SXM4-80GB", None),
])
def test_card_peaks_come_from_the_device_name(name, peaks):
    assert _gpu_loss_module().card_peaks(name) == peaks


def test_liger_runs_only_where_its_default_chunking_gives_few_chunks():
    mod = _gpu_loss_module()
    # Liger 0.8.5: chunk = next_power_of_2(ceil(B / ceil(n / k))), at most B.
    assert mod.liger_chunks(16, 32, 10_000) == 16
    assert mod.liger_chunks(4096, 128, 10_000) == 64
    assert mod.liger_chunks(4096, 128, 100_000) == 512
    assert mod.liger_chunks(256, 128, 100) == 1
    runs = [c for c in mod.GRID if mod.liger_chunks(*c) <= mod.LIGER_MAX_CHUNKS]
    assert (16, 128, 1_000_000) in runs and (4096, 32, 1_000_000) not in runs


def test_bench_gpu_loss_rejects_bad_arguments():
    for args, msg in ((["--methods", "jax_default,tf"], "Argument `--methods` must be"),
                      (["--time-limit", "0"], "Argument `--time-limit` must be a positive"),
                      (["--reps", "0"], "Argument `--reps` must be a positive integer")):
        proc = subprocess.run([sys.executable, str(GPU_LOSS), *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2 and msg in proc.stderr, (args, proc.stderr)


_COMPETITOR_CHECK = r"""
import json, sys, importlib.util, torch
spec = importlib.util.spec_from_file_location("m", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
z, c, y = [torch.from_numpy(a) for a in m.problem(5, 8, 37)]
out = {}
for name in sys.argv[2:]:
    zg, cg = z.clone().requires_grad_(), c.clone().requires_grad_()
    if name == "cce_torch_compile":
        # CCE's own PyTorch implementation on the bench's inputs (its Triton one needs an
        # Ampere GPU): pins down e = s*u, c = M and bias = -s/2 ||M||^2.
        from cut_cross_entropy import linear_cross_entropy
        e, bias = m._torch_linear_inputs(zg, cg, m.SCALE)
        loss = linear_cross_entropy(e, cg, y, bias=bias, impl="torch_compile")
    else:
        class Env: torch = torch; compile_backend = "eager"
        loss = m.torch_builder(Env, name, z, c, y, m.SCALE)[0](zg, cg)
    dz, dm = torch.autograd.grad(loss, (zg, cg))
    out[name] = m.checks(loss, dz, dm, z, c)
print(json.dumps(out))
"""


def test_liger_and_cut_cross_entropy_compute_the_ecoc_loss_where_installed():
    # Needs triton, liger-kernel and cut-cross-entropy, which the CPU venv lacks: point
    # ECOC_BENCH_SITE at a folder that has them (pip install --target DIR triton
    # .whl/liger_kernel-*.whl .whl/cut_cross_entropy-*.whl). Checked in a subprocess:
    # Triton in the TensorFlow test process is not needed and not wanted. Liger runs
    # under the Triton interpreter on the CPU.
    site = os.environ.get("ECOC_BENCH_SITE", "")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p))
    probe = subprocess.run([sys.executable, "-c", "import triton, liger_kernel, cut_cross_entropy"],
                           capture_output=True, text=True, timeout=120, env=env)
    if probe.returncode:
        pytest.skip("triton, liger-kernel or cut-cross-entropy not importable (set "
                    "ECOC_BENCH_SITE): " + probe.stderr.strip().splitlines()[-1])
    proc = subprocess.run([sys.executable, "-c", _COMPETITOR_CHECK, str(GPU_LOSS), "liger",
                           "cce_torch_compile"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    mod = _gpu_loss_module()
    z, codes, labels = mod.problem(5, 8, 37)
    loss, dz, dm = _float64_reference(z, codes, labels, mod.SCALE)
    for name, r in got.items():
        assert r["loss"] == pytest.approx(loss, rel=2e-6), name
        assert r["dz_norm"] == pytest.approx(np.linalg.norm(dz), rel=1e-5), name
        assert r["dm_norm"] == pytest.approx(np.linalg.norm(dm), rel=1e-5), name
        assert abs(r["dz_proj"] - np.sum(dz * z[:, ::-1])) <= 1e-5 * r["dz_norm"] * r["pz_norm"]
        assert abs(r["dm_proj"] - np.sum(dm * codes[:, ::-1])) <= 1e-5 * r["dm_norm"] * r["pm_norm"]


_FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *compute_cap*--format=csv,noheader*) case "$*" in
      *name*) echo "NVIDIA H100 80GB HBM3, 9.0, 580.00" ;;
      *) echo "9.0" ;; esac ;;
  *) echo "fake nvidia-smi: NVIDIA H100 80GB HBM3" ;;
esac
"""
# A stand-in for nvcc whose "harness" answers every mode device_check.sh uses and, in its
# timing mode, writes the rows where device_run.sh says ($ECOC_HARNESS_JSON): the
# connection the real harness is to make.
_FAKE_NVCC = r"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake nvcc"; echo "Build fake_13.0"; exit 0; fi
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
cat > "$out" <<'HARNESS'
#!/bin/sh
case "$1" in
  --bench-only)
    printf '[{"B": 4, "k": 8, "n": 100, "mode": "3xtf32", "fwd_ms": 0.01, "fwdbwd_ms": 0.02, "peak_bytes": 4096}]' > "$ECOC_HARNESS_JSON"
    echo "## Timings"; echo "Largest drop: 0" ;;
  *) echo "7 checks, 0 failed" ;;
esac
HARNESS
chmod +x "$out"
"""
_FAKE_SANITIZER = """#!/bin/sh
while [ "$1" != "${1#-}" ] || [ "$1" = memcheck ] || [ "$1" = racecheck ] || [ "$1" = 1 ]; do shift; done
"$@" && echo "========= ERROR SUMMARY: 0 errors"
"""


@pytest.mark.slow
def test_device_run_on_a_fake_gpu_merges_the_harness_rows_into_the_loss_table(_device_runs):
    # About 30 s: the whole run with stand-ins for nvidia-smi, nvcc and compute-sanitizer
    # and bench_gpu_loss on the CPU (--simulate-gpu); the streaming benchmark is left out.
    run = _device_runs[0]["_fake_gpu_run"]
    out = run.folder / "out"
    proc = run.result(timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (out / "summary.md").read_text()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1]
            for line in summary.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["kernels"] == "pass" and rows["gpuloss"] == "pass", summary
    assert rows["bench"] == "SKIPPED", summary
    assert "harness rows merged" in summary
    check = (out / "device_check.md").read_text()
    assert "| grid | pass |" in check and "| racecheck | pass |" in check
    assert "| build | pass |" in check and "copied the prebuilt ecoc_harness_sm90" in check
    table = (out / "bench_gpu_loss.md").read_text()
    assert "| 4 | 8 | 100 | keras-ecoc CUDA, 3xtf32 (single calls) | fp32 | 0.01 | 0.02 | 0.0039 |" in table
    assert "| 4 | 8 | 100 | 3xtf32 (single calls) | 0.02 | " in table  # the targets table
    assert json.loads((out / "bench_gpu_loss.json").read_text())["harness_rows"][0]["B"] == 4
    assert len([p for p in out.rglob("*") if p.is_file()]) <= 8


# --- device_run_backends.sh and bench_fused_backends.py --device gpu (issue 17) ------------

DEVICE_RUN_BACKENDS = REPO / "benchmarks" / "device_run_backends.sh"
FUSED_BACKENDS = REPO / "benchmarks" / "bench_fused_backends.py"


def test_device_run_backends_dry_run_fits_its_budget_even_when_every_phase_runs_to_its_limit():
    proc = subprocess.run(["bash", str(DEVICE_RUN_BACKENDS), "--dry-run"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    phases = [(name, int(lim), int(at)) for name, lim, at in
              re.findall(r"^phase (\S+) \(<= (\d+) s, starts by (\d+) s\)", proc.stdout, re.M)]
    assert [p[0] for p in phases] == ["info", "wheels", "build", "status", "bench", "fit"]
    assert max(lim + at for _, lim, at in phases) <= 280  # + the 5 s kill margin: under 5 minutes
    limits = {n: lim for n, lim, _ in phases}
    assert limits["bench"] >= 20 and limits["fit"] >= 70  # even in the worst case
    bench = next(line for line in proc.stdout.splitlines() if line.startswith("phase bench "))
    assert "--device gpu --backends jax,torch --batch 16,256 --k 32,128 --n 10000,100000,1000000" in bench
    assert re.search(r"--time-limit (\d+)", bench) and int(re.search(r"--time-limit (\d+)", bench)[1]) \
        < limits["bench"]
    fit = next(line for line in proc.stdout.splitlines() if line.startswith("phase fit "))
    assert "--backends jax --models classifier onehot --n 100000 1000000" in fit
    files = proc.stdout.splitlines()[0].rsplit(": ", 1)[1].split()
    assert len(files) <= 8 and "bench_fused_backends_gpu.json" in files and "fit_jax_gpu.jsonl" in files


@pytest.mark.parametrize("env,arg,message", [
    ({"DEVICE_RUN_BACKENDS_BUDGET": "4m"}, "--dry-run",
     "Received: DEVICE_RUN_BACKENDS_BUDGET=4m"),
    ({}, "--wet-run", "unknown argument '--wet-run'"),
])
def test_device_run_backends_refuses_a_bad_budget_or_argument(env, arg, message):
    proc = subprocess.run(["bash", str(DEVICE_RUN_BACKENDS), arg], capture_output=True, text=True,
                          timeout=30, env=dict(os.environ, **env))
    assert proc.returncode == 3 and message in proc.stderr


def test_device_run_backends_without_a_gpu_says_no_gpu_for_every_gpu_phase(tmp_path):
    _no_gpu_or_skip()
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, WHEEL_DIR=str(tmp_path / "none"),
               SITE_DIR=str(tmp_path / "site"))
    proc = subprocess.run(["nice", "-n", "19", "bash", str(DEVICE_RUN_BACKENDS)], capture_output=True,
                          text=True, timeout=200, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (out / "backends_summary.md").read_text()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1]
            for line in summary.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows == {"phase": "status", "info": "pass", "wheels": "pass", "build": "NO GPU",
                    "status": "NO GPU", "bench": "NO GPU", "fit": "NO GPU"}, summary
    assert {p.name for p in out.iterdir()} == {"backends_summary.md", "backends.log"}


def _run_fused_backends(*args, timeout=240, **env):
    return subprocess.run(["nice", "-n", "19", sys.executable, str(FUSED_BACKENDS), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", **env))


def test_bench_fused_backends_gpu_refuses_tensorflow_and_says_no_gpu_in_one_line(tmp_path):
    proc = _run_fused_backends("--device", "gpu", "--backends", "jax,tensorflow")
    assert proc.returncode == 2
    assert "must be a comma-separated subset of jax,torch. Received: --backends=jax,tensorflow" \
        in proc.stderr
    _no_gpu_or_skip()
    proc = _run_fused_backends("--device", "gpu", "--backends", "jax", "--batch", "4", "--k", "8",
                               "--n", "1000", "--json", str(tmp_path / "rows.json"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "bench_fused_backends --device gpu: no GPU: jax: JAX sees no GPU" in proc.stderr
    assert "Traceback" not in proc.stderr
    saved = json.loads((tmp_path / "rows.json").read_text())
    assert saved["rows"] == [] and saved["no_gpu"][0].startswith("jax: JAX sees no GPU")


@pytest.mark.slow
def test_bench_fused_backends_names_every_cell_its_time_limit_left_out(tmp_path):
    # About 20 s: one JAX worker (simulated GPU) whose deadline has passed
    # before its first cell: nothing is measured, every cell is named.
    rows_json = tmp_path / "rows.json"
    proc = _run_fused_backends("--device", "gpu", "--simulate-gpu", "--backends", "jax",
                               "--batch", "4", "--k", "8", "--n", "1000,2000", "--reps", "1",
                               "--time-limit", "0.001", "--grace", "150", "--json", str(rows_json))
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = json.loads(rows_json.read_text())
    assert saved["rows"] == []
    named = {tuple(c[:4]): c[4] for c in saved["skipped"]}
    assert set(named) == {(4, 8, n, p) for n in (1000, 2000) for p in ("fused", "streaming", "dense")}
    assert all(why == "jax: time limit" for why in named.values())
    assert "Skipped cells: B=4 k=8 n=1000 dense (jax: time limit)" in proc.stdout


def test_bench_fused_backends_table_shows_device_memory_masked_peaks_and_skipped_cells(capsys):
    mod = load_script(FUSED_BACKENDS, "bench_fused_backends")
    row = dict(backend="jax", B=16, k=32, n=10000, device="gpu", ms=1.25, cpu_ms=1.0, peak_mb=3.0)
    rows = [dict(row, path="fused", dev_peak_mb=2.5),
            dict(row, path="streaming", dev_peak_mb=None, dev_peak_masked=True)]
    skipped = [(16, 32, 10000, "dense", "dense logits over 0.5 MiB"),
               (16, 32, 10**6, "fused", "torch: time limit")]  # another backend's: not this row's

    class Args:
        backends, paths = "jax", "fused,streaming,dense"

    mod.render(rows, skipped, Args)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(" | ")[4:7] == ["fused ms", "streaming ms", "dense ms"]
    assert "fused device MiB" in lines[0] and "dense host MiB" in lines[0]
    assert lines[2] == ("| jax | 16 | 32 | 1e4 | 1.2 | 1.2 | skipped | 2.5 | masked | skipped "
                        "| 3.0 | 3.0 | skipped |")
    assert lines[3].startswith("| jax | 16 | 32 | 1e6 | - | - | - |")
    assert any("B=16 k=32 n=1e+06 fused (torch: time limit)" in line for line in lines)


@pytest.fixture(scope="module")
def _status_phase_runs(request, tmp_path_factory):
    """The status phase of each case of the test below, both started at once
    (each is four Python processes one after another)."""
    def start(fault, folder):
        env = dict(os.environ, OUT=str(folder / "out"), PYTHON=sys.executable,
                   JAX_PLATFORMS="cpu", DEVICE_RUN_BACKENDS_ONLY="status")
        if fault:
            env["DEVICE_FUSED_CHECK_FAULT"] = fault
        return ["nice", "-n", "19", "bash", str(DEVICE_RUN_BACKENDS), "--simulate-gpu"], env

    yield from _side_by_side(
        request, tmp_path_factory,
        "test_device_run_backends_status_fails_naming_the_error_when_a_fused_call_raises",
        "fault", start)


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / "keras_ecoc" / "_lib" / "_ecoc_kernels.so").exists(),
                    reason="the kernel library is not built (kernels/build.py --no-cuda)")
@pytest.mark.parametrize("fault", [None, "RESOURCE_EXHAUSTED: keras_ecoc: no FFI scratch memory"])
def test_device_run_backends_status_fails_naming_the_error_when_a_fused_call_raises(
        _status_phase_runs, fault):
    # About 30 s per case, the two side by side: the status phase alone
    # (--simulate-gpu: the CPU kernels) runs the dispatcher check and one jitted
    # fused loss + gradient per backend against float64 NumPy. On the H100 of
    # 2026-11-26 the old phase said "pass" while every JAX fused call raised; a
    # raising call must now fail it.
    run = _status_phase_runs[fault]
    out = run.folder / "out"
    proc = run.result(timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (out / "backends_summary.md").read_text()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:4]
            for line in summary.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["build"][0] == "SKIPPED" and rows["fit"][0] == "SKIPPED", summary
    log = (out / "backends.log").read_text()
    if fault is None:
        assert rows["status"][0] == "pass", summary + log[-3000:]
        for b in ("jax", "torch"):
            assert f"pass {b} fused loss + gradient (B=8 k=16 n=1000 s=10)" in log
    else:
        assert rows["status"][0] == "FAIL", summary
        note = rows["status"][2]
        assert "FAIL jax fused loss + gradient" in note and f"RuntimeError: {fault}" in note
        assert f"FAIL torch fused loss + gradient (B=8 k=16 n=1000 s=10): the call raised " \
               f"RuntimeError: {fault}" in log


@pytest.mark.parametrize("seed", [3, 4])
def test_fused_check_reference_gradient_matches_finite_differences(seed):
    # The float64 reference of benchmarks/device_fused_check.py is analytic;
    # central differences of its loss pin its gradient down independently.
    mod = load_script(REPO / "benchmarks" / "device_fused_check.py", "device_fused_check")
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(3, 5))
    codes = rng.normal(size=(40, 5)) / np.sqrt(5)
    labels = rng.integers(0, 40, size=3)
    _, grad = mod.reference(z, codes, labels, 7.0)
    fd = np.zeros_like(z)
    for idx in np.ndindex(*z.shape):
        dz = np.zeros_like(z)
        dz[idx] = 1e-6
        fd[idx] = (mod.reference(z + dz, codes, labels, 7.0)[0]
                   - mod.reference(z - dz, codes, labels, 7.0)[0]) / 2e-6
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


# --- bench_gpu_loss.py: the order of the work and the cap of a slow method -------------

def test_bench_gpu_loss_measures_the_target_cells_first_and_the_baselines_first_within_a_cell():
    mod = _gpu_loss_module()

    class Args:
        quick = simulate_gpu = False
        reference = True
        methods = ",".join(mod.METHODS)

    work = dict(mod.plan(Args))
    for framework, items in work.items():
        cells = [tuple(c) for c, _ in items]
        first_seen = list(dict.fromkeys(cells))
        assert len(first_seen) == 18
        groups = [0 if (b <= 256 and n >= 10**5) else 1 if b <= 256 else 2 for b, _, n in first_seen]
        assert groups == sorted(groups) and groups.count(0) == 8 and groups.count(2) == 6, first_seen
        assert first_seen[0] == (16, 32, 100_000) and first_seen[-1] == (4096, 128, 1_000_000)
    torch_methods = [m for c, m in work["torch"] if tuple(c) == (256, 128, 100_000)]
    assert torch_methods == ["ref", "cce_exact", "cce_tf32", "torch_compile", "torch_compile_tf32",
                             "liger"]
    assert [m for c, m in work["jax"] if tuple(c) == (16, 32, 100_000)] == ["jax_default",
                                                                              "jax_highest"]


@pytest.mark.parametrize("call_ms,blocks", [(0.5, 5), (900.0, 4), (1700.0, 2), (9000.0, 1)])
def test_bench_gpu_loss_cuts_the_timed_blocks_of_a_slow_call_to_the_step_budget(call_ms, blocks):
    mod = _gpu_loss_module()
    calls = []

    def block_ms(call, reps):  # a stand-in clock: every call takes call_ms
        calls.append(reps)
        return call_ms * reps

    class Args:
        reps, block_ms, max_calls, step_budget = 5, 40.0, 100, 4.0

    row = {}
    mod._timed(row, "fwdbwd", block_ms, None, Args)
    assert row["fwdbwd_ms"] == pytest.approx(call_ms)
    assert len(calls) == 1 + blocks  # the sizing call, then the timed blocks
    assert sum(calls[1:]) * call_ms <= 4000 or blocks == 1
    if blocks < 5:
        assert row["fwdbwd_blocks"] == blocks and row["cut"] == [f"fwdbwd: {blocks} of 5 blocks"]
    else:
        assert "cut" not in row and "fwdbwd_blocks" not in row
    text = mod.render({"t0": 0, "status": "finished", "simulated": False, "scale": 16.0, "reps": 5,
                       "probe": {}, "card": None, "notes": [], "skipped": [], "elapsed_s": 1.0,
                       "rows": [dict(row, method="cce_exact", B=16, k=32, n=10**6,
                                     framework="torch")]})
    assert ("cce_exact B=16 k=32 n=1000000 (fwdbwd: " in text) == (blocks < 5)


def test_check_harness_json_accepts_the_auto_and_warps8_launch_variants(tmp_path):
    mod = _gpu_loss_module()
    path = tmp_path / "h.json"
    path.write_text(json.dumps([{"B": 16, "k": 32, "n": 10**5, "mode": mode, "fwd_ms": 0.1,
                                 "fwdbwd_ms": 0.2, "peak_bytes": 10}
                                for mode in ("3xtf32+auto", "tf32+warps8", "fp32+rows64+warps8")]))
    rows = mod.load_harness_json(str(path))
    assert [mod.harness_precision(r["mode"]) for r in rows] == ["fp32", "tf32", "fp32"]


def test_harness_rows_timed_in_blocks_are_shown_and_scored_with_those_times(tmp_path):
    # The harness times its auto rows in blocks of back-to-back calls too
    # (as this script times JAX, PyTorch and CCE): those times go in the
    # table and the targets; a row timed only in single calls says so.
    mod = _gpu_loss_module()
    cell = (256, 128, 100_000)
    path = tmp_path / "h.json"
    path.write_text(json.dumps([
        {"B": cell[0], "k": cell[1], "n": cell[2], "mode": "3xtf32+auto", "fwd_ms": 2.0,
         "fwdbwd_ms": 6.0, "peak_bytes": 2**20, "fwd_block_ms": 1.0, "fwdbwd_block_ms": 4.0,
         "fwd_block_calls": 20, "fwdbwd_block_calls": 5},
        {"B": cell[0], "k": cell[1], "n": cell[2], "mode": "3xtf32+rows64", "fwd_ms": 2.5,
         "fwdbwd_ms": 7.0, "peak_bytes": 2**20}]))
    rows = mod.load_harness_json(str(path))
    assert [(r["timing"], r["fwd_ms"], r["fwdbwd_ms"]) for r in rows] == [
        ("blocks", 1.0, 4.0), ("single calls", 2.5, 7.0)]
    assert (rows[0]["single_fwd_ms"], rows[0]["single_fwdbwd_ms"]) == (2.0, 6.0)
    state = {"status": "complete", "scale": 16.0, "reps": 5, "card": "NVIDIA H100 80GB HBM3",
             "probe": {}, "skipped": [], "notes": [], "elapsed_s": 60.0,
             "rows": [{"method": "jax_default", "B": cell[0], "k": cell[1], "n": cell[2],
                       "fwd_ms": 3.0, "fwdbwd_ms": 10.0, "peak_bytes": 2**30}]}
    text = mod.render(state, rows)
    assert "| keras-ecoc CUDA, 3xtf32+auto | fp32 | 1.000 | 4.000 |" in text
    assert "| keras-ecoc CUDA, 3xtf32+rows64 (single calls) | fp32 | 2.500 | 7.000 |" in text
    # Only the auto row is scored: 4 ms against JAX's 10.
    assert "| 3xtf32+auto | 4.000 | 0.40 (≤ 0.5: met) |" in text
    assert "rows64" not in text.split("### Issue 16's targets")[1]
    path.write_text(json.dumps([{"B": 1, "k": 1, "n": 1, "mode": "fp32", "fwd_ms": 1,
                                 "fwdbwd_ms": 1, "peak_bytes": 1, "fwdbwd_block_ms": -1}]))
    with pytest.raises(ValueError, match="fwdbwd_block_ms must be a non-negative number"):
        mod.load_harness_json(str(path))


RETIME = REPO / "kernels" / "cuda" / "device_retime.sh"
NCU_STALLS = REPO / "kernels" / "cuda" / "ncu_stalls.sh"


def test_device_retime_times_each_variant_with_the_prebuilt_harness_and_refuses_a_stale_one(
        _prebuilt, tmp_path):
    whl, env = _prebuilt
    run_env = dict(os.environ, DEVICE_CHECK_PREBUILT_DIR=str(whl), NVCC=env["NVCC"],
                   OUT=str(tmp_path / "out"))

    def retime(*args, **extra):
        return subprocess.run(["bash", str(RETIME), *args], capture_output=True, text=True,
                              timeout=60, env=dict(run_env, **extra))

    proc = retime("rows64", "auto", "rows128+regsoftmax")
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "out" / "bench.log").read_text()
    assert log.startswith(f"prebuilt: match {whl / 'ecoc_harness_sm90'}")
    assert log.count("## Timings") == 3
    # '+' is outside the device tool's file-name rule: the file says '_'.
    for v in ("rows64", "auto", "rows128_regsoftmax"):
        rows = json.loads((tmp_path / "out" / f"timing_{v}.json").read_text())
        assert rows[0]["mode"] == "3xtf32"
    # A harness built from other sources would time the old kernels: refused, nothing run.
    stale = tmp_path / "stale"
    shutil.copytree(whl, stale)
    (stale / "ecoc_harness_sm90.stamp").write_text("0" * 64 + "\n")
    proc = retime("v2", DEVICE_CHECK_PREBUILT_DIR=str(stale), OUT=str(tmp_path / "out2"))
    assert proc.returncode == 4 and "does not match this tree" in proc.stderr
    assert not (tmp_path / "out2" / "timing_v2.json").exists()
    proc = subprocess.run(["bash", str(NCU_STALLS)], capture_output=True, text=True, timeout=60,
                          env=dict(run_env, DEVICE_CHECK_PREBUILT_DIR=str(stale),
                                   OUT=str(tmp_path / "out3")))
    assert proc.returncode == 4 and "does not match this tree" in proc.stderr
    # Bad command lines.
    for args, why in (((), "name at least one variant"), (("--ncu", "X"), "--ncu needs"),
                      (("a", "b", "c", "d", "e", "f", "g", "h"), "at most 7 variants"),
                      (("a", "b", "c", "d", "e", "--ncu", "K", "a", "fp32"),
                       "at most 4 variants with --ncu"),
                      (("--fast",), "unknown option '--fast'")):
        proc = retime(*args)
        assert proc.returncode == 3 and why in proc.stderr, (args, proc.stderr)


def test_the_next_sessions_retime_command_fits_the_device_tools_file_limit(tmp_path):
    # kernels/cuda/README.md's step (3) names six variants: the script must accept
    # them (it refused more than 4 before) and name every file within the tool's rule.
    readme = (REPO / "kernels" / "cuda" / "README.md").read_text()
    command = re.search(r"`OUT=\$OUT bash kernels/cuda/device_retime\.sh ([^`]+)`", readme)
    variants = command.group(1).split()
    assert len(variants) == 6
    files = ["bench.log"] + [f"timing_{v.replace('+', '_')}.json" for v in variants]
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    proc = subprocess.run(["bash", str(RETIME), *variants], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, OUT=str(tmp_path / "out"),
                                               DEVICE_CHECK_PREBUILT_DIR=str(tmp_path / "none")))
    # No prebuilt harness here: refused for that (exit 4), not for the count (exit 3).
    assert proc.returncode == 4, proc.stderr


def _one_cell_state(rows):
    return {"status": "complete", "scale": 16.0, "reps": 5, "card": "NVIDIA H100 80GB HBM3",
            "probe": {}, "skipped": [], "notes": [], "elapsed_s": 60.0, "rows": rows}


def test_a_row_above_its_float64_tolerance_is_wrong_and_never_meets_a_target():
    mod = _gpu_loss_module()
    cell = dict(B=256, k=128, n=100_000)
    ref = dict(cell, method="ref", loss=2.0, dz_norm=1.0, dz_proj=0.5, pz_norm=1.0,
               dm_norm=1.0, dm_proj=0.5, pm_norm=1.0)

    def timed(method, ms, loss):
        return dict(ref, method=method, fwd_ms=ms / 3, fwdbwd_ms=ms, peak_bytes=2**20,
                    loss=loss)

    # JAX DEFAULT (TF32) 1e-4 off: within its tolerance; CCE exact (FP32) 1e-3 off: WRONG.
    state = _one_cell_state([ref, timed("jax_default", 10.0, 2.0002), timed("cce_exact", 1.0, 2.002)])
    harness = [dict(cell, method="ecoc_cuda[3xtf32+auto]", mode="3xtf32+auto", fwd_ms=1.0,
                    fwdbwd_ms=4.0, peak_bytes=2**20),
               dict(cell, method="ecoc_cuda[3xtf32+rows64]", mode="3xtf32+rows64", fwd_ms=1.0,
                    fwdbwd_ms=2.0, peak_bytes=2**20)]
    text = mod.render(state, harness)
    assert "| 1.0e-03 WRONG |" in text and "CCE cce_exact, highest" in text
    targets = text.split("### Issue 16's targets")[1]
    # The wrong CCE row is no reference, and only the library's own (+auto) row is scored.
    assert "| 3xtf32+auto | 4.000 | 0.40 (≤ 0.5: met) | n/a |" in targets
    assert "3xtf32+rows64" not in targets
    assert mod.check_row(timed("cce_exact", 1.0, 2.002), ref)[0] == "WRONG"
    assert mod.check_row(timed("jax_default", 1.0, 2.0002), ref)[0] == "ok"
    assert mod.check_row(dict(cell, method="jax_default", fwdbwd_ms=1.0), None)[0] == "unchecked"


@pytest.mark.parametrize("grid_status, kept", [("pass", True), ("FAIL", False)])
def test_harness_rows_are_left_out_unless_the_device_checks_passed(tmp_path, grid_status, kept):
    mod = _gpu_loss_module()
    md = tmp_path / "device_check.md"
    md.write_text("| step | status | seconds | result |\n|---|---|---:|---|\n"
                  "| checks | pass | 40 | 14425 checks, 0 failed |\n"
                  f"| grid | {grid_status} | 90 | 512 checks, 3 failed |\n")
    assert (mod.harness_checks_failed(str(md)) is None) == kept
    if not kept:
        assert "grid: FAIL" in mod.harness_checks_failed(str(md))
    (tmp_path / "empty.md").write_text("")
    assert "checks: not run" in mod.harness_checks_failed(str(tmp_path / "empty.md"))
    missing = mod.harness_checks_failed(str(tmp_path / "absent.md"))
    assert missing and "not readable" in missing


_FAKE_NVCC_HANGING_CHECKS = r"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake nvcc"; echo "Build fake_13.0"; exit 0; fi
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
cat > "$out" <<'HARNESS'
#!/bin/sh
case "$1" in
  --check-only) echo $$ > "$HANG_PID_FILE"; exec sleep 300 ;;
  *) echo "7 checks, 0 failed" ;;
esac
HARNESS
chmod +x "$out"
"""


def test_device_check_stopped_from_outside_ends_its_running_step_and_still_reports(tmp_path):
    # The device run stops a phase with `timeout`, whose TERM reaches device_check.sh's
    # process group but not the step's own (`timeout` leads one): the step used to keep
    # the GPU busy through the next phase, and device_check.md was never written.
    bin_dir = _fake_tools(tmp_path / "bin")
    (bin_dir / "nvcc").write_text(_FAKE_NVCC_HANGING_CHECKS)
    pid_file = tmp_path / "hang.pid"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               NVCC=str(bin_dir / "nvcc"), OUT=str(tmp_path / "out"),
               COMPUTE_SANITIZER=str(bin_dir / "compute-sanitizer"),
               DEVICE_CHECK_PREBUILT_DIR=str(tmp_path / "none"), HANG_PID_FILE=str(pid_file),
               DEVICE_CHECK_T_CHECK="200")
    proc = subprocess.run(["timeout", "-s", "TERM", "8", "bash", str(DEVICE_CHECK)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 124, proc.stderr  # timeout's status: it had to stop it
    pid = int(pid_file.read_text())
    time.sleep(1)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the hanging step is gone
    md = (tmp_path / "out" / "device_check.md").read_text()
    assert "| build | pass |" in md
    assert "| checks | FAIL |" in md and "stopped: device_check.sh was told to stop" in md
