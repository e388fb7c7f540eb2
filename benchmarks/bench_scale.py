#!/usr/bin/env python
"""What many classes cost: ECOC heads against a one-hot head, per backend.

For every (backend, model, n) one fresh subprocess builds the code matrix,
then a model, and trains it with `model.fit` on random data:

  classifier  `ECOCClassifier(backbone, codes)` compiled with its defaults
              (`ECOCLoss.from_decoder` and `ECOCAccuracy.from_decoder`)
  loss        a Dense(k) head compiled with `ECOCLoss(codes)` and
              `metrics=[ECOCAccuracy(codes)]` (the README's standalone use)
  loss_nometric  the same head and loss with no ECOC metric (on JAX the
              loss's codes then are no variable the trainer maps; see
              docs/api.md, "ECOCLoss on JAX"); not run by default
  onehot      a Dense(n) head with `SparseCategoricalCrossentropy
              (from_logits=True)` and the "accuracy" metric

The one-hot rows run `--onehot-steps` steps for `--onehot-epochs` epochs
(default 3 x 2): a Dense(10^6) head takes minutes a step on a 2-core CPU,
and what its rows are for is the peak RSS the ECOC heads must stay below,
plus a step time from those few steps.

Reported per run (one JSON line each, appended to --out as soon as the run
ends, so a killed benchmark keeps what finished):

  codes_mib       size of the float32 code matrix (0 for the one-hot head)
  first_epoch_s   wall time of the first epoch (traces and compiles)
  epoch_s         wall time of each later epoch
  step_ms         median later epoch / steps
  step_times_ms   wall time of every step (on_train_batch_begin to _end)
  cpu_s           user + system CPU time of the process at the end of fit
  peak_mib        peak RSS (VmHWM) above the RSS once the codes exist (the
                  peak is reset with /proc/self/clear_refs after the codes
                  are made; glibc's mmap threshold is pinned at 64 KiB so
                  freed buffers return to the OS)
  peak_after_construct_mib  the same peak, read after the model, loss and
                  metrics are built and compiled but before `fit`
  device_peak_mib on a GPU (JAX's default backend "gpu", or PyTorch with
                  CUDA): the process's peak device memory at the end of fit
                  (JAX peak_bytes_in_use, torch.cuda.max_memory_allocated;
                  one fresh process per run, so weights, optimizer state,
                  codes and every temporary); absent on the CPU

Optional rows (`--reload`): save the trained classifier to .keras, reload it
in the same process and compare predictions (peak of the load reported).

Spectral code generation (`--spectral`, a row group of its own): calls
`keras_ecoc.codes.class_similarity(..., n_neighbors=10)` on the synthetic
class means of `bench_spectral_scale.py` (256 features; same data and calls
as that benchmark, whose table in docs/benchmarks.md has the stage times,
recall and residuals), a sparse k-nearest-neighbour graph, then
`keras_ecoc.codes.spectral`; the row says "not available" when the package
cannot build such a similarity.

Usage:
    python benchmarks/bench_scale.py --n 200000 --out scale.jsonl
    python benchmarks/bench_scale.py --n 10000 100000 1000000 --k 64 \\
        --backends tensorflow jax torch --models classifier loss onehot \\
        --out docs/results/scale.jsonl --overwrite
    python benchmarks/bench_scale.py --render docs/results/scale.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("tensorflow", "jax", "torch")
MODELS = ("classifier", "loss", "onehot")
ALL_MODELS = MODELS + ("loss_nometric",)


# ----------------------------------------------------------------- worker


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB -> MiB
    return float("nan")


def _reset_peak():
    # Resets VmHWM to the current RSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _device_peak_mib(backend):
    """(device name, peak device memory of this process in MiB), or (None, None) off the GPU."""
    if backend == "jax":
        import jax

        if jax.default_backend() != "gpu":
            return None, None
        peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        return str(jax.devices()[0]), None if peak is None else peak / 2**20
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return None, None
        torch.cuda.synchronize()
        return torch.cuda.get_device_name(), torch.cuda.max_memory_allocated() / 2**20
    return None, None


def _make_codes(n, k, seed=0):
    """Unit-norm Gaussian codes (n, k) float32, made in chunks (no float64 copy)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    codes = np.empty((n, k), np.float32)
    for i in range(0, n, 1 << 16):
        block = rng.standard_normal((min(1 << 16, n - i), k), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        codes[i : i + len(block)] = block
    return codes


def worker(args):
    os.environ["KERAS_BACKEND"] = args.backend
    import ctypes

    try:  # freed buffers go back to the OS, so RSS follows live memory
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    except OSError:
        pass
    import numpy as np

    import keras

    import keras_ecoc

    row = {
        "backend": args.backend, "model": args.model, "n": args.n, "k": args.k,
        "batch": args.batch, "steps": args.steps, "epochs": args.epochs,
        "features": args.features, "load1_start": os.getloadavg()[0],
    }
    row["loss_path"] = keras_ecoc.ops.loss_path(args.n)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((args.batch * args.steps, args.features)).astype("float32")
    y = rng.integers(0, args.n, size=(args.batch * args.steps,)).astype("int32")
    keras.utils.set_random_seed(0)
    rss_base = _status("VmRSS")
    codes = None
    if args.model != "onehot":
        codes = _make_codes(args.n, args.k)
        row["codes_mib"] = codes.nbytes / 2**20
    else:
        row["codes_mib"] = 0.0
    rss_codes = _status("VmRSS")
    row["rss_base_mib"] = rss_base
    _reset_peak()

    t0 = time.perf_counter()
    inputs = keras.Input((args.features,))
    if args.model == "classifier":
        hidden = keras.layers.Dense(args.features, activation="relu")(inputs)
        backbone = keras.Model(inputs, hidden)
        model = keras_ecoc.ECOCClassifier(backbone, codes)
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
    elif args.model in ("loss", "loss_nometric"):
        hidden = keras.layers.Dense(args.features, activation="relu")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(args.k)(hidden))
        metrics = [keras_ecoc.ECOCAccuracy(codes)] if args.model == "loss" else []
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras_ecoc.ECOCLoss(codes),
            metrics=metrics,
        )
    else:
        hidden = keras.layers.Dense(args.features, activation="relu")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(args.n)(hidden))
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    # The caller's array is dropped: the model, loss and metrics hold the codes.
    del codes
    row["construct_s"] = time.perf_counter() - t0
    row["peak_after_construct_mib"] = _status("VmHWM") - rss_codes

    times = []
    step_times = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.t)

        def on_train_batch_begin(self, batch, logs=None):
            self.step_t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            # Per step, so that one slow step shows as such in an epoch's time.
            step_times.append(round(1000.0 * (time.perf_counter() - self.step_t), 1))

    history = model.fit(x, y, batch_size=args.batch, epochs=args.epochs,
                        verbose=0, shuffle=False, callbacks=[Timer()])
    row["first_epoch_s"] = times[0]
    row["epoch_s"] = times[1:]
    later = times[1:] or times
    row["step_ms"] = 1000.0 * statistics.median(later) / args.steps
    row["step_times_ms"] = step_times
    row["cpu_s"] = sum(os.times()[:2])  # user + system, all threads
    row["peak_mib"] = _status("VmHWM") - rss_codes
    row["final_loss"] = float(history.history["loss"][-1])
    device, device_peak = _device_peak_mib(args.backend)
    if device is not None:
        row["device"], row["device_peak_mib"] = device, device_peak
    if args.reload and args.model == "classifier":
        import tempfile

        path = os.path.join(tempfile.mkdtemp(), "model.keras")
        before = model.predict_classes(x[: args.batch], verbose=0)
        model.save(path)
        row["saved_mib"] = os.path.getsize(path) / 2**20
        del model
        import gc

        gc.collect()
        rss_before_load = _status("VmRSS")
        _reset_peak()
        loaded = keras.saving.load_model(path)
        row["load_peak_mib"] = _status("VmHWM") - rss_before_load
        after = loaded.predict_classes(x[: args.batch], verbose=0)
        row["reload_identical"] = bool(np.array_equal(before, after))
    print("ROW " + json.dumps(row), flush=True)


def spectral_worker(args):
    """Spectral codes at n classes from a sparse k-NN similarity of class means.

    Hook for the spectral-generation rows: `keras_ecoc.codes.class_similarity`
    with `n_neighbors` (a sparse graph, never (n, n)) then
    `keras_ecoc.codes.spectral`. Which neighbour search and eigensolver run
    is up to `keras_ecoc.codes`; this only times the public calls.
    """
    import numpy as np

    import keras_ecoc.codes as codes_mod

    row = {"backend": "numpy", "model": "spectral", "n": args.n, "k": args.k}
    if not (hasattr(codes_mod, "spectral") and hasattr(codes_mod, "class_similarity")):
        row["status"] = "not available: keras_ecoc.codes lacks spectral/class_similarity"
        print("ROW " + json.dumps(row), flush=True)
        return
    # The data of bench_spectral_scale.py (this directory), so that both
    # benchmarks time the same code path on the same means.
    from bench_spectral_scale import _class_means

    means = _class_means(args.n, args.features_spectral, seed=0)
    rss = _status("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    try:
        similarity = codes_mod.class_similarity(
            means, np.arange(args.n), num_classes=args.n, n_neighbors=args.neighbors)
    except (TypeError, ValueError) as e:
        row["status"] = f"not available: sparse k-NN similarity failed: {e}"
        print("ROW " + json.dumps(row), flush=True)
        return
    row["similarity_s"] = time.perf_counter() - t0
    codes = codes_mod.spectral(similarity, args.k)
    row["seconds"] = time.perf_counter() - t0
    row["peak_mib"] = _status("VmHWM") - rss
    row["codes_shape"] = list(np.shape(codes))
    row["status"] = "ok"
    print("ROW " + json.dumps(row), flush=True)


# ----------------------------------------------------------------- driver


def _run_one(argv, env, timeout):
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *argv],
            capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return {"status": f"timeout after {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("ROW "):
            row = json.loads(line[4:])
            row.setdefault("status", "ok")
            row["wall_s"] = time.perf_counter() - t0
            return row
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
    return {"status": f"failed (rc {proc.returncode})", "error": "\n".join(tail)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[200_000])
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--k-for-1e7", type=int, default=32,
                   help="code length used for n >= 10^7 (1.2 GB of codes at k=32)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--onehot-steps", type=int, default=3,
                   help="steps per epoch of the one-hot rows: a Dense(n) head at n = 10^6 "
                        "takes minutes a step here, so its rows measure the peak and a "
                        "step time from a few steps (with --onehot-epochs)")
    p.add_argument("--onehot-epochs", type=int, default=2)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=ALL_MODELS)
    p.add_argument("--reload", action="store_true",
                   help="classifier runs also save, reload and compare predictions")
    p.add_argument("--spectral", action="store_true",
                   help="also time keras_ecoc.codes.spectral with a sparse k-NN similarity")
    p.add_argument("--features-spectral", type=int, default=256)
    p.add_argument("--neighbors", type=int, default=10, help="k-NN graph degree (spectral)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    p.add_argument("--out", help="JSON lines file, one row per finished run")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--render", nargs="+", metavar="FILE",
                   help="print a Markdown table of the rows of JSON lines files")
    # Worker mode (internal).
    p.add_argument("--worker", choices=("fit", "spectral"))
    p.add_argument("--backend", choices=BACKENDS)
    p.add_argument("--model", choices=ALL_MODELS)
    args = p.parse_args(argv)

    if args.worker == "fit":
        args.n = args.n[0]
        return worker(args)
    if args.worker == "spectral":
        args.n = args.n[0]
        return spectral_worker(args)
    if args.render:
        print(render(*args.render))
        return 0
    counts = {"n": min(args.n), "k": args.k, "k-for-1e7": args.k_for_1e7,
              "batch": args.batch, "steps": args.steps, "epochs": args.epochs,
              "onehot-steps": args.onehot_steps, "onehot-epochs": args.onehot_epochs,
              "features": args.features, "features-spectral": args.features_spectral,
              "neighbors": args.neighbors, "timeout": args.timeout}
    for name, value in counts.items():
        if value < (2 if name == "n" else 1):
            p.error(f"Argument `--{name}` must be {'>= 2' if name == 'n' else 'a positive integer'}"
                    f". Received: --{name}={value}")
    if args.out and os.path.exists(args.out) and not args.overwrite:
        p.error(f"{args.out} exists; pass --overwrite to replace it")
    if args.out:
        open(args.out, "w").close()
    header = {"host": platform.node(), "cpus": os.cpu_count(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "note": "machine shared with other jobs; see load1",
              "load1": os.getloadavg()[0], "commit": _commit()}
    _emit(header, args.out)
    for n in args.n:
        k = args.k_for_1e7 if n >= 10_000_000 else args.k
        if args.spectral:
            row = _run_one(["--worker", "spectral", "--n", str(n), "--k", str(k),
                            "--features-spectral", str(args.features_spectral),
                            "--neighbors", str(args.neighbors)],
                           dict(os.environ), args.timeout)
            row.update({"model": "spectral", "n": n, "k": k})
            _emit(row, args.out)
        for backend in args.backends:
            for model in args.models:
                env = dict(os.environ, KERAS_BACKEND=backend,
                           PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
                env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
                onehot = model == "onehot"
                steps = args.onehot_steps if onehot else args.steps
                epochs = args.onehot_epochs if onehot else args.epochs
                wargs = ["--worker", "fit", "--backend", backend, "--model", model,
                         "--n", str(n), "--k", str(k), "--batch", str(args.batch),
                         "--steps", str(steps), "--epochs", str(epochs),
                         "--features", str(args.features)]
                if args.reload:
                    wargs.append("--reload")
                row = _run_one(wargs, env, args.timeout)
                row.update({"backend": backend, "model": model, "n": n, "k": k})
                row["load1"] = os.getloadavg()[0]
                _emit(row, args.out)
    return 0


def _commit():
    """The checked-out commit (with "+dirty" for local changes), or None."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _emit(row, out):
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def _load(row):
    """The 1-minute load average at the start and at the end of a run."""
    start, end = row.get("load1_start"), row.get("load1")
    if start is None:
        return _fmt(end, ".1f")
    return f"{start:.1f}-{_fmt(end, '.1f')}"


def render(*paths):
    """A Markdown table of the fit rows (and the spectral rows) of JSON lines files."""
    rows = [json.loads(line) for path in paths for line in open(path) if line.strip()]
    fits = [r for r in rows if r.get("model") in ALL_MODELS]
    lines = [
        "| n | k | backend | model | codes MiB | peak above codes MiB | first epoch s "
        "| later epoch s | step ms | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in fits:
        if r.get("status") != "ok":
            lines.append(f"| {r['n']:,} | {r['k']} | {r['backend']} | {r['model']} "
                         f"| | | | | | {r.get('status')} |")
            continue
        later = r.get("epoch_s") or []
        notes = [f"{r.get('steps', '?')} steps/epoch"]
        if r.get("device_peak_mib") is not None:
            notes.append(f"{r['device']}: peak device memory {r['device_peak_mib']:,.0f} MiB")
        if "reload_identical" in r:
            notes.append(f"reload: identical={r['reload_identical']}, "
                         f"load peak {r['load_peak_mib']:.0f} MiB, file {r['saved_mib']:.0f} MiB")
        lines.append(
            f"| {r['n']:,} | {r['k']} | {r['backend']} | {r['model']} "
            f"| {r['codes_mib']:.0f} | {r['peak_mib']:,.0f} | {r['first_epoch_s']:.1f} "
            f"| {', '.join(f'{t:.1f}' for t in later)} | {r['step_ms']:.0f} "
            f"| load1 {_load(r)}; {'; '.join(notes)} |"
        )
    spectral = [r for r in rows if r.get("model") == "spectral"]
    if spectral:
        lines += ["", "| n | k | spectral codes | seconds | peak MiB |", "|---|---|---|---|---|"]
        for r in spectral:
            lines.append(f"| {r['n']:,} | {r['k']} | {r.get('status')} "
                         f"| {_fmt(r.get('seconds'), '.1f')} | {_fmt(r.get('peak_mib'), ',.0f')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
