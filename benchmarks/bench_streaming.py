#!/usr/bin/env python
"""Benchmark of the streaming ECOC loss on JAX and PyTorch against their dense paths.

For every (B, k, n) it measures forward + backward (gradient w.r.t. z, the
codes fixed, as in the TensorFlow table) of

  JAX    stream   keras_ecoc.ops streaming implementation under jax.jit
         dense    the pure-Keras path (keras_ecoc.decoding.cross_entropy) under jax.jit
  Torch  stream   the streaming torch.autograd.Function (eager; it is a graph
                  break under torch.compile by design)
         eager    a dense PyTorch loss (B x n logits + F.cross_entropy), eager
         compiled the same dense loss under torch.compile (inductor, dynamic
                  shapes: compiled once, time of the first call reported apart)

Time: median of the timed repeats after one warm-up call (compilation
excluded). Memory: peak RSS of the timed steps above the RSS after warm-up
(/proc/self/clear_refs + VmHWM; glibc's mmap threshold is pinned at 64 KiB so
freed buffers go back to the OS); for JAX also XLA's own buffer assignment
(`jit(...).lower(...).compile().memory_analysis().temp_size_in_bytes`). Each
(backend, method) runs in a fresh subprocess.

Then: a tile-size table (streaming time vs classes per tile) and one
end-to-end `model.fit` epoch with 100,000 classes on JAX and on PyTorch (ECOC
head + streaming loss against a one-hot Dense(n) head).

GPU mode (`--device gpu`): torch tensors on CUDA and JAX arrays on the GPU;
time = median of the timed repeats, each ending in `torch.cuda.synchronize()`
or `block_until_ready()`; memory = for PyTorch `max_memory_allocated()` after
`reset_peak_memory_stats()` minus the bytes allocated before the timed steps,
for JAX XLA's temp buffer size plus the growth of the device's
`peak_bytes_in_use` (reported only where this configuration raised the
process's peak; otherwise an earlier, larger one masks it: "masked"). The grid
adds n = 1,000,000. Order: grid, then `model.fit`, then tiles; `--time-limit`
caps the whole run (each subprocess gets a share of the time left; what
does not fit is listed as skipped or stopped, with the cells it finished). The GPU run
never touches docs/benchmarks.md: it writes its own Markdown section to
`--out` (and every row as JSON beside it, `<out without .md>.json`), after
each subprocess, so a killed run leaves what had finished.

Usage:
    python benchmarks/bench_streaming.py                # full run, updates docs/benchmarks.md
    python benchmarks/bench_streaming.py --quick        # tiny smoke run
    python benchmarks/bench_streaming.py --device gpu --out gpu.md [--quick] [--time-limit S]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
METHODS = {"jax": ("stream", "dense"), "torch": ("stream", "eager", "compiled"),
           "tensorflow": ("stream", "dense")}
# TensorFlow is measured on the CPU only: its streaming path is the fallback
# for a failed op build (the GPU machine has no TensorFlow).
GPU_BACKENDS = ("jax", "torch")
BEGIN = "<!-- bench_streaming:begin -->"
END = "<!-- bench_streaming:end -->"


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def problem(np, b, k, n, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(b, k)).astype(np.float32)
    codes = rng.normal(size=(n, k)).astype(np.float32)
    labels = rng.integers(0, n, size=b).astype(np.int32)
    return z, codes, labels


def _gpu_env_ok(backend, simulate):
    """Raises RuntimeError (one clear line) unless `backend` sees a CUDA GPU."""
    if simulate:
        return
    if backend == "jax":
        import jax

        if jax.default_backend() != "gpu":
            raise RuntimeError(f"JAX sees no GPU (default backend {jax.default_backend()!r}, "
                               f"devices {jax.devices()})")
    else:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"PyTorch {torch.__version__} sees no CUDA GPU "
                               "(torch.cuda.is_available() is False)")


def make_step(backend, method, b, k, n, tile=None, device="cpu", simulate=False):
    """Returns (step, info): step() runs forward + backward and blocks.

    device="gpu": the inputs live on the GPU (JAX's first device, torch "cuda";
    with `simulate`, on the CPU, to test this code path without a GPU) and
    step() ends with block_until_ready() / torch.cuda.synchronize().
    """
    if device == "gpu":
        return _make_gpu_step(backend, method, b, k, n, tile, simulate)
    import numpy as np

    from keras_ecoc.ops import _dispatch

    z, codes, labels = problem(np, b, k, n)
    tile = tile or _dispatch.tile_size(b, n, k, backend)
    info = {}
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        from keras_ecoc import decoding
        from keras_ecoc.ops import _streaming_jax

        zj, cj, yj = jnp.asarray(z), jnp.asarray(codes), jnp.asarray(labels)
        valid = jnp.ones((b,), bool)
        if method == "stream":
            def loss(z):
                return jnp.sum(_streaming_jax.cross_entropy(z, cj, yj, valid, 4.0, tile))
        else:
            def loss(z):
                return jnp.sum(decoding.cross_entropy(yj, z, cj, 4.0))
        grad = jax.jit(jax.grad(loss))
        info["xla_temp_mb"] = grad.lower(zj).compile().memory_analysis().temp_size_in_bytes / 2**20

        def step():
            grad(zj).block_until_ready()
        return step, info
    if backend == "tensorflow":
        return _tensorflow_step(method, z, codes, labels, tile), info
    import torch

    from keras_ecoc.ops import _streaming_torch

    zt = torch.tensor(z, requires_grad=True)
    ct, yt = torch.tensor(codes), torch.tensor(labels).long()
    valid = torch.ones(b, dtype=torch.bool)
    scale = torch.tensor(4.0)
    if method == "stream":
        def fb(z):
            _streaming_torch.cross_entropy(z, ct, yt, valid, scale, tile).sum().backward()
    else:
        fb = _dense_torch_loss(scale, ct, yt)
        if method == "compiled":
            fb = torch.compile(fb, dynamic=True)

    def step():
        zt.grad = None
        fb(zt)
    return step, info


def _tensorflow_step(method, z, codes, labels, tile):
    """Gradient w.r.t. z under tf.function(jit_compile=True): the streaming
    fallback (`_streaming_tf`, used when the op library is missing) or the
    dense pure-Keras loss."""
    import tensorflow as tf

    from keras_ecoc import decoding
    from keras_ecoc.ops import _streaming_tf

    zt, ct, yt = tf.constant(z), tf.constant(codes), tf.constant(labels)
    valid = tf.ones((len(labels),), tf.bool)
    scale = tf.constant(4.0)

    @tf.function(jit_compile=True)
    def grad(z):
        with tf.GradientTape() as tape:
            tape.watch(z)
            if method == "stream":
                loss = tf.reduce_sum(_streaming_tf.cross_entropy(z, ct, yt, valid, scale, tile))
            else:
                loss = tf.reduce_sum(decoding.cross_entropy(yt, z, ct, 4.0))
        return tape.gradient(loss, z)

    def step():
        grad(zt).numpy()
    return step


def _dense_torch_loss(scale, ct, yt):
    import torch
    import torch.nn.functional as F

    csq = (ct * ct).sum(-1)

    def fb(z):
        u = z * torch.rsqrt(torch.clamp_min((z * z).sum(-1, keepdim=True), 1e-12))
        logits = -0.5 * scale * (csq[None] - 2.0 * u @ ct.T + (u * u).sum(-1, keepdim=True))
        F.cross_entropy(logits, yt, reduction="sum").backward()
    return fb


def _gpu_tile_size(b, n, k, backend, simulate):
    """The library's default tile for this shape on a GPU.

    Passes on_gpu=True where `_dispatch.tile_size` takes it (the GPU tile
    budget), so the table measures what a user's GPU run gets.
    """
    import inspect

    from keras_ecoc.ops import _dispatch

    if "on_gpu" in inspect.signature(_dispatch.tile_size).parameters:
        return _dispatch.tile_size(b, n, k, backend, on_gpu=not simulate)
    return _dispatch.tile_size(b, n, k, backend)


def _make_gpu_step(backend, method, b, k, n, tile, simulate):
    import numpy as np

    z, codes, labels = problem(np, b, k, n)
    info = {}
    if not tile and method == "stream":
        info["default_tile"] = tile = _gpu_tile_size(b, n, k, backend, simulate)
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        from keras_ecoc import decoding
        from keras_ecoc.ops import _streaming_jax

        dev = jax.devices()[0]
        inputs = [jax.device_put(a, dev) for a in (z, codes, labels, np.ones((b,), bool))]
        # Codes, labels and the mask are arguments, not closed-over constants,
        # so a 1e6 x k code matrix is never baked into the compiled program.
        if method == "stream":
            def loss(z, c, y, valid):
                return jnp.sum(_streaming_jax.cross_entropy(z, c, y, valid, 4.0, tile))
        else:
            def loss(z, c, y, valid):
                return jnp.sum(decoding.cross_entropy(y, z, c, 4.0))
        # One compilation serves both the memory analysis and the timed calls.
        compiled = jax.jit(jax.grad(loss)).lower(*inputs).compile()
        info["xla_temp_mb"] = compiled.memory_analysis().temp_size_in_bytes / 2**20

        def step():
            compiled(*inputs).block_until_ready()
        return step, info
    import torch

    from keras_ecoc.ops import _streaming_torch

    dev = torch.device("cpu" if simulate else "cuda")
    zt = torch.tensor(z, device=dev, requires_grad=True)
    ct = torch.tensor(codes, device=dev)
    yt = torch.tensor(labels, device=dev).long()
    valid = torch.ones(b, dtype=torch.bool, device=dev)
    scale = torch.tensor(4.0, device=dev)
    if method == "stream":
        def fb(z):
            _streaming_torch.cross_entropy(z, ct, yt, valid, scale, tile).sum().backward()
    else:
        fb = _dense_torch_loss(scale, ct, yt)
        if method == "compiled":
            fb = torch.compile(fb, dynamic=True)
    sync = (lambda: None) if simulate else torch.cuda.synchronize

    def step():
        zt.grad = None
        fb(zt)
        sync()
    return step, info


class _DeviceMemory:
    """Peak device memory of the timed steps above what was allocated before them.

    PyTorch: reset_peak_memory_stats() after the warm-up, then
    max_memory_allocated() - memory_allocated() (exact). JAX has no peak reset:
    peak_bytes_in_use after the timed steps minus bytes_in_use before the
    warm-up, valid only if this configuration raised the process's peak (else
    None and masked=True: an earlier configuration's peak was higher).
    Without device statistics (simulated GPU, CPU device) every value is None.
    """

    def __init__(self, backend, simulate):
        self.backend, self.simulate = backend, simulate
        self.base = self.peak0 = None

    def _jax_stats(self):
        import jax

        try:
            return jax.devices()[0].memory_stats() or None
        except Exception:  # noqa: BLE001 - backends without statistics
            return None

    def before_warmup(self):
        if self.backend == "jax" and not self.simulate:
            st = self._jax_stats()
            if st and "peak_bytes_in_use" in st:
                self.base, self.peak0 = st["bytes_in_use"], st["peak_bytes_in_use"]

    def before_timed(self):
        if self.backend == "torch" and not self.simulate:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()

    def result(self):
        if self.simulate or self.base is None:
            return {"dev_peak_mb": None}
        if self.backend == "torch":
            import torch

            return {"dev_peak_mb": (torch.cuda.max_memory_allocated() - self.base) / 2**20}
        st = self._jax_stats() or {}
        peak = st.get("peak_bytes_in_use")
        if peak is None:
            return {"dev_peak_mb": None}
        if peak <= self.peak0:
            return {"dev_peak_mb": None, "dev_peak_masked": True}
        return {"dev_peak_mb": (peak - self.base) / 2**20}


def measure_gpu(step, budget, max_repeats, backend, simulate):
    mem = _DeviceMemory(backend, simulate)
    mem.before_warmup()
    t0 = time.perf_counter()
    step()  # warm-up: tracing / compilation / autotuning
    first = time.perf_counter() - t0
    mem.before_timed()
    times = []
    start = time.perf_counter()
    while len(times) < max_repeats and (len(times) < 3 or time.perf_counter() - start < budget):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    res = {"ms": 1e3 * statistics.median(times), "first_s": first, "repeats": len(times)}
    res.update(mem.result())
    return res


def measure(step, budget, max_repeats):
    t0 = time.perf_counter()
    step()  # warm-up: tracing / compilation
    first = time.perf_counter() - t0
    base = _status_kb("VmRSS")
    reset_peak()
    times = []
    start = time.perf_counter()
    while len(times) < max_repeats and (len(times) < 2 or time.perf_counter() - start < budget):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    peak = (_status_kb("VmHWM") - base) / 1024.0
    return {"ms": 1e3 * statistics.median(times), "first_s": first, "rss_mb": max(peak, 0.0),
            "repeats": len(times)}


def worker(args):
    backend, method = args.worker.split(":")
    gpu = args.device == "gpu"
    if gpu:
        try:
            _gpu_env_ok(backend, args.simulate_gpu)
        except RuntimeError as e:
            raise SystemExit(f"worker {backend}:{method}: {e}") from None
    if backend == "torch":
        import torch

        # One process measures many shapes; dynamo's default of 8 graphs per
        # function would send the later ones to the uncompiled loop.
        torch._dynamo.config.recompile_limit = 64
    out = []
    for cfg in json.loads(args.configs):
        b, k, n = cfg[:3]
        tile = cfg[3] if len(cfg) > 3 else None
        if gpu:
            step, info = make_step(backend, method, b, k, n, tile, "gpu", args.simulate_gpu)
            res = measure_gpu(step, args.budget, args.max_repeats, backend, args.simulate_gpu)
            del step  # frees this configuration's device buffers before the next
        else:
            step, info = make_step(backend, method, b, k, n, tile)
            res = measure(step, args.budget, args.max_repeats)
        res.update(info, B=b, k=k, n=n, tile=tile, backend=backend, method=method)
        if backend == "torch" and method == "stream":
            from keras_ecoc.ops import _streaming_torch

            res["loop"] = _streaming_torch.compile_status()  # compiled scan or Python loop
        out.append(res)
        print(json.dumps(res), flush=True)
    return out


def fit_worker(args):
    import numpy as np

    import keras

    from keras_ecoc import ops as eops

    kind = args.fit_worker
    gpu = args.device == "gpu"
    if gpu:
        try:
            _gpu_env_ok(keras.backend.backend(), args.simulate_gpu)
        except RuntimeError as e:
            raise SystemExit(f"fit worker {kind}: {e}") from None
    n, k, samples, batch = args.fit_classes, 128, args.fit_samples, 256
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 64)).astype(np.float32)
    y = rng.integers(0, n, size=samples).astype(np.int32)
    keras.utils.set_random_seed(0)
    layers = [keras.Input((64,)), keras.layers.Dense(256, activation="relu")]
    if kind == "ecoc":
        codes = (np.sign(rng.normal(size=(n, k))) / np.sqrt(k)).astype(np.float32)
        if gpu:  # on the device once, not copied from the host at every step
            codes = keras.ops.convert_to_tensor(codes)

        def loss(y_true, y_pred):
            labels = keras.ops.cast(keras.ops.reshape(y_true, (-1,)), "int32")
            return eops.ecoc_cross_entropy(labels, y_pred, codes, 8.0)
        model = keras.Sequential(layers + [keras.layers.Dense(k)])
        path = eops.backend_status(n)
    else:
        model = keras.Sequential(layers + [keras.layers.Dense(n)])
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        path = "dense one-hot"
    model.compile(optimizer="adam", loss=loss)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # warm-up (tracing)
    base = _status_kb("VmRSS")
    reset_peak()
    t = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    epoch = time.perf_counter() - t
    res = {"kind": kind, "backend": keras.backend.backend(), "epoch_s": epoch,
           "step_ms": 1e3 * epoch / (samples // batch), "samples": samples,
           "rss_mb": max((_status_kb("VmHWM") - base) / 1024.0, 0.0),
           "params": model.count_params(), "path": path}
    if gpu:
        res.update(classes=n, dev_peak_mb=_process_peak_mb(keras.backend.backend(),
                                                           args.simulate_gpu))
    print(json.dumps(res), flush=True)


def _process_peak_mb(backend, simulate):
    """Peak device memory this process ever allocated (MB); None without statistics."""
    if simulate:
        return None
    if backend == "torch":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    import jax

    st = jax.devices()[0].memory_stats() or {}
    return st["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in st else None


def run(cmd, env_backend, timeout, extra_env=None, status=None):
    """Runs this script's `cmd` in a subprocess; returns the JSON rows it printed.

    A worker killed at `timeout` still gives the rows it had printed. `status`
    (a dict, optional) receives "timed_out" (bool) and "rc".
    """
    env = dict(os.environ, KERAS_BACKEND=env_backend, MALLOC_MMAP_THRESHOLD_="65536",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3", **(extra_env or {}))
    try:
        proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(f"timeout after {timeout} s: {cmd}", file=sys.stderr)
        proc = None
        if status is not None:
            status.update(timed_out=True, rc=None)
    else:
        out = proc.stdout
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
        if status is not None:
            status.update(timed_out=False, rc=proc.returncode)
    rows = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # the last line of a killed worker
                pass
    return rows


def fmt(v, digits=1):
    if v is None:
        return "n/a"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}f}" if v >= 0.1 else f"{v:.2f}"


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import jax
    import torch

    return (f"{platform.node()}: {cpu}, {os.cpu_count()} cores; JAX {jax.__version__} (CPU), "
            f"PyTorch {torch.__version__}")


# The grid table's columns after (B, k, n): (backend, method, field); the memory
# field is "mem" here and the device's own measure in each table.
GRID_COLUMNS = (("jax", "stream", "ms"), ("jax", "dense", "ms"),
                ("jax", "stream", "xla_temp_mb"), ("jax", "dense", "xla_temp_mb"),
                ("jax", "stream", "mem"), ("jax", "dense", "mem"),
                ("torch", "stream", "ms"), ("torch", "eager", "ms"),
                ("torch", "compiled", "ms"), ("torch", "stream", "mem"),
                ("torch", "eager", "mem"), ("torch", "compiled", "mem"))
TARGETS_HEADER = ("### Targets at n >= 10,000 (memory >= 10x below the dense path, time no worse "
                  "than the compiled dense path; 'time Nx dense' > 1 means streaming is faster, "
                  "within 10 % counts as met)")


def _grid_header(mem):
    """The grid table's header rows; `mem` names the memory columns ("RSS", "peak")."""
    return ["| B | k | n | JAX stream ms | JAX dense (jit) ms | JAX stream XLA temp MB | "
            f"JAX dense XLA temp MB | JAX stream {mem} MB | JAX dense {mem} MB | torch stream ms | "
            f"torch dense eager ms | torch dense compiled ms | torch stream {mem} MB | "
            f"torch dense eager {mem} MB | torch dense compiled {mem} MB | logits MB |",
            "|" + "---|" * 16]


def _grid_rows_and_targets(cells, get, mem_field, mem_label):
    """Table rows and target lines for the (B, k, n) `cells`.

    get(backend, method, b, k, n, field) -> a number, None (not measured) or a
    string shown as is (e.g. "masked"); `mem_field` is the row field of the
    memory columns, `mem_label` how the target lines name it.
    """
    rows, targets = [], []
    for (b, k, n) in cells:
        def at(bk, m, f):
            return get(bk, m, b, k, n, mem_field if f == "mem" else f)
        row = [str(b), str(k), str(n)]
        for bk, m, f in GRID_COLUMNS:
            v = at(bk, m, f)
            row.append(v if isinstance(v, str) else fmt(v, 1 if f == "ms" else 2))
        row.append(fmt(b * n * 4 / 2**20, 2))
        rows.append("| " + " | ".join(row) + " |")
        if n < 10_000:
            continue
        js, jd = at("jax", "stream", "ms"), at("jax", "dense", "ms")
        jms, jmd = at("jax", "stream", "xla_temp_mb"), at("jax", "dense", "xla_temp_mb")
        ts, tc = at("torch", "stream", "ms"), at("torch", "compiled", "ms")
        trs, trd = at("torch", "stream", "mem"), at("torch", "compiled", "mem")
        msg = f"- B={b}, k={k}, n={n}:"
        if None not in (js, jd, jms, jmd):
            mem = jmd / max(jms, 0.1)
            ok = mem >= 10 and js <= jd * 1.1
            msg += (f" JAX memory {mem:.0f}x below dense (XLA temp), time {jd / js:.2f}x "
                    f"dense ({'met' if ok else 'NOT met'});")
        if None not in (ts, tc) and all(isinstance(v, float) for v in (trs, trd)):
            mem = trd / max(trs, 0.1)
            ok = mem >= 10 and ts <= tc * 1.1
            msg += (f" PyTorch memory {mem:.0f}x below compiled dense ({mem_label}), time "
                    f"{tc / ts:.2f}x compiled dense ({'met' if ok else 'NOT met'})")
        if not msg.endswith(":"):  # a cell with no JAX or PyTorch rows says nothing
            targets.append(msg)
    return rows, targets


def _compile_note(grid):
    """The line on torch.compile's first call of the dense loss ([] if not measured)."""
    comp = [r for r in grid if r["method"] == "compiled"]
    if not comp:
        return []
    return ["", f"torch.compile of the dense loss (first call, dynamic shapes): "
            f"{max(r['first_s'] for r in comp):.0f} s at most over the grid "
            f"({comp[0]['first_s']:.0f} s for the first shape)."]


def _tile_table(tiles, args):
    """The classes-per-tile table: header and one row per (backend, B) measured."""
    lines = ["| backend | B | k | n | " + " | ".join(f"C={c}" for c in args.tile_sizes) + " |",
             "|" + "---|" * (4 + len(args.tile_sizes))]
    tk = {(r["backend"], r["B"], r["tile"]): r["ms"] for r in tiles}
    for bk in ("jax", "torch"):
        for b in (16, 256):
            if any((bk, b, c) in tk for c in args.tile_sizes):
                lines.append(f"| {bk} | {b} | {args.tile_k} | {args.tile_n} | " + " | ".join(
                    fmt(tk.get((bk, b, c))) for c in args.tile_sizes) + " |")
    return lines


def render(grid, tiles, fits, elapsed, args):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    key = {(r["backend"], r["method"], r["B"], r["k"], r["n"]): r for r in grid}
    lines = [BEGIN, "", "## JAX and PyTorch: the streaming loss against each backend's dense path", "",
             f"Generated by `python benchmarks/bench_streaming.py` on {now} ({elapsed / 60:.1f} min).",
             "", f"- Machine: {machine()}.",
             f"- Load average (1 min) {args.load_before:.1f} before the run and "
             f"{os.getloadavg()[0]:.1f} after it (the benchmark's own processes included); "
             "on a shared machine timings move by tens of percent, the memory columns do not.",
             "- GPU: see the section below (`--device gpu`, run on a lent GPU machine).", "",
             "Forward + backward w.r.t. z (codes fixed). Time: median of the timed repeats after a "
             "warm-up call (compilation excluded). RSS MB: peak RSS of the timed steps above the "
             "RSS after warm-up, in one subprocess per (backend, method). XLA temp MB: XLA's "
             "buffer assignment for the jitted gradient (exact peak of temporaries). Dense "
             "PyTorch: B x n logits + `F.cross_entropy`, eager and `torch.compile(dynamic=True)`. "
             "Streaming PyTorch: the tile loop as a compiled `scan` inside a custom op "
             "(keras_ecoc/ops/_streaming_torch.py). Logits MB = B·n·4 bytes.", ""]
    lines += _grid_header("RSS")

    def get(bk, m, b, k, n, f):
        r = key.get((bk, m, b, k, n))
        return None if r is None else r.get(f)

    rows, targets = _grid_rows_and_targets(args.grid, get, "rss_mb", "RSS")
    lines += rows + _compile_note(grid)
    lines += ["", TARGETS_HEADER, ""] + targets + _tensorflow_table(key, args)
    if tiles:
        lines += ["", "### Classes per tile (streaming, forward + backward w.r.t. z, ms)", ""]
        lines += _tile_table(tiles, args)
        from keras_ecoc.ops import _dispatch

        rules = []
        for bk in ("jax", "torch"):
            budget, high = _dispatch.TILE_BUDGET[bk]
            here = ", ".join(f"{_dispatch.tile_size(b, args.tile_n, args.tile_k, bk)} at B = {b}"
                             for b in (16, 256))
            rules.append(f"{bk} C = 2^{budget.bit_length() - 1} / (B + k) clipped to "
                         f"[{_dispatch.MIN_TILE}, {high}] ({here})")
        lines += ["", "CPU defaults (keras_ecoc/ops/_dispatch.py): " + "; ".join(rules) + "."]
    if fits:
        lines += ["", "### End-to-end: one `model.fit` epoch with 100,000 classes", "",
                  f"Synthetic data: {fits[0]['samples']} examples of 64 features, batch 256, "
                  "backbone Dense(64 -> 256, relu); ECOC head Dense(256 -> 128) + "
                  "`keras_ecoc.ops.ecoc_cross_entropy`, one-hot head Dense(256 -> 100,000) + "
                  "sparse categorical cross-entropy from logits; Adam; Keras default "
                  "`jit_compile` (XLA on JAX, eager on PyTorch). Peak RSS above the RSS after a "
                  "warm-up epoch.", "",
                  "| backend | model | step time ms | epoch s | peak RSS above baseline MB | "
                  "parameters | loss path |", "|---|---|---|---|---|---|---|"]
        for r in fits:
            name = "ECOC k=128 + streaming loss" if r["kind"] == "ecoc" else "one-hot Dense(n)"
            lines.append(f"| {r['backend']} | {name} | {fmt(r['step_ms'])} | {fmt(r['epoch_s'], 2)} "
                         f"| {fmt(r['rss_mb'])} | {r['params']:,} | {r['path'].split(':')[0]} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def _tensorflow_table(key, args):
    """Markdown lines for the TensorFlow streaming fallback, [] if not measured."""
    if not any(bk == "tensorflow" for bk, *_ in key):
        return []
    lines = ["", "### TensorFlow without the op library: the streaming fallback against the dense "
             "path", "", "Both under `tf.function(jit_compile=True)`, forward + backward w.r.t. z. "
             "Time only: TensorFlow's allocator keeps the pool it grew during the warm-up call, "
             "so the RSS of the timed steps does not see their buffers (no memory column). This "
             "is what a failed kernel build costs in time.", "",
             "| B | k | n | TF stream ms | TF dense ms | time ratio (dense / stream) |",
             "|---|---|---|---|---|---|"]
    for (b, k, n) in args.grid:
        st, de = key.get(("tensorflow", "stream", b, k, n)), key.get(("tensorflow", "dense", b, k, n))
        if st is None or de is None:
            continue
        lines.append(f"| {b} | {k} | {n} | {fmt(st['ms'])} | {fmt(de['ms'])} | "
                     f"{de['ms'] / st['ms']:.2f}x |")
    return lines


def write_doc(section, path, begin=BEGIN, end=END):
    text = open(path).read() if os.path.exists(path) else ""
    if begin in text and end in text:
        text = text[:text.index(begin)] + section.rstrip("\n") + text[text.index(end) + len(end):]
    elif text.strip():
        text = text.rstrip("\n") + "\n\n" + section
    else:
        text = section
    with open(path, "w") as f:
        f.write(text)


GPU_BEGIN = "<!-- bench_streaming_gpu:begin -->"
GPU_END = "<!-- bench_streaming_gpu:end -->"


def probe_worker():
    """Prints one JSON line: the card, driver and versions this machine offers."""
    info = {"python": platform.python_version(), "host": platform.node()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                              "compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = (smi.stdout.strip() or smi.stderr.strip()).splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError) as e:
        info["nvidia_smi"] = f"not available ({type(e).__name__})"
    try:
        import torch

        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                    torch_gpu=torch.cuda.is_available())
        if info["torch_gpu"]:
            prop = torch.cuda.get_device_properties(0)
            info.update(gpu_name=prop.name, gpu_cc=f"{prop.major}.{prop.minor}",
                        gpu_mem_gib=round(prop.total_memory / 2**30, 1),
                        gpu_sms=prop.multi_processor_count)
    except Exception as e:  # noqa: BLE001 - reported, never fatal
        info.update(torch_error=f"{type(e).__name__}: {e}", torch_gpu=False)
    try:
        import jax

        info.update(jax=jax.__version__, jax_backend=jax.default_backend(),
                    jax_devices=[str(d) for d in jax.devices()])
        info["jax_gpu"] = info["jax_backend"] == "gpu"
    except Exception as e:  # noqa: BLE001
        info.update(jax_error=f"{type(e).__name__}: {e}", jax_gpu=False)
    print(json.dumps(info), flush=True)


def gpu_machine(probe, simulated):
    driver = "?"
    parts = [x.strip() for x in probe.get("nvidia_smi", "").split(",")]
    if len(parts) >= 2:
        driver = parts[1]
    card = probe.get("gpu_name", "no CUDA GPU seen by PyTorch")
    if "gpu_cc" in probe:
        card += (f" (compute capability {probe['gpu_cc']}, {probe['gpu_sms']} SMs, "
                 f"{probe['gpu_mem_gib']} GiB)")
    line = (f"{card}; driver {driver}; PyTorch {probe.get('torch', '?')} (CUDA "
            f"{probe.get('torch_cuda', '?')}); JAX {probe.get('jax', '?')} "
            f"({probe.get('jax_backend', '?')} backend); Python {probe.get('python', '?')}")
    if simulated:
        line = "SIMULATED (--simulate-gpu: the GPU code path on CPU devices; no GPU numbers). " + line
    return line


def render_gpu(state, args, elapsed):
    """The GPU Markdown section from the rows gathered so far (partial runs too)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    grid, tiles, fits = state["grid"], state["tiles"], state["fits"]
    key = {(r["backend"], r["method"], r["B"], r["k"], r["n"]): r for r in grid}
    lines = [GPU_BEGIN, "",
             "## JAX and PyTorch on a GPU: the streaming loss against each backend's dense path",
             "", f"Generated by `python benchmarks/bench_streaming.py --device gpu"
             f"{' --quick' if args.quick else ''}` on {now} ({elapsed / 60:.1f} min"
             f", {state['status']}).",
             "", f"- Machine: {gpu_machine(state['probe'], args.simulate_gpu)}.",
             "", "Forward + backward w.r.t. z (codes fixed), inputs on the GPU. Time: median of "
             f"up to {args.max_repeats} timed repeats ({args.budget} s budget, at least "
             f"{min(3, args.max_repeats)}) after "
             "a warm-up call, each ending in `torch.cuda.synchronize()` / "
             "`block_until_ready()` (compilation excluded). XLA temp MB: XLA's buffer "
             "assignment for the jitted gradient. Peak MB: device memory above what was "
             "allocated before the steps (PyTorch: `max_memory_allocated()` after "
             "`reset_peak_memory_stats()`; JAX: growth of `peak_bytes_in_use`, 'masked' where "
             "an earlier, larger configuration of the same subprocess had set the peak). One "
             "subprocess per (backend, method). Logits MB = B·n·4 bytes.", ""]

    def get(bk, m, b, k, n, f):
        r = key.get((bk, m, b, k, n))
        if r is None:
            return None
        if f == "dev_peak_mb" and r.get("dev_peak_masked"):
            return "masked"
        return r.get(f)

    if grid:
        cells = sorted(args.grid, key=lambda c: (c[2], c[0], c[1]))
        rows, targets = _grid_rows_and_targets(cells, get, "dev_peak_mb", "device peak")
        lines += _grid_header("peak") + rows
    else:
        lines.append("(no grid cell measured)")
        targets = []
    lines += _compile_note(grid)
    if targets:
        lines += ["", TARGETS_HEADER, ""] + targets
    if fits:
        lines += ["", f"### End-to-end: one `model.fit` epoch with {fits[0]['classes']:,} classes "
                  "on the GPU", "",
                  f"Synthetic data: {fits[0]['samples']} examples of 64 features, batch 256, "
                  "backbone Dense(64 -> 256, relu); ECOC head Dense(256 -> 128) + "
                  "`keras_ecoc.ops.ecoc_cross_entropy`, one-hot head Dense(256 -> n) + "
                  "sparse categorical cross-entropy from logits; Adam; Keras default "
                  "`jit_compile` (XLA on JAX, eager on PyTorch); timed epoch after a warm-up "
                  "epoch. Peak device MB: the most device memory the process ever held "
                  "(PyTorch `max_memory_allocated()`, JAX `peak_bytes_in_use`).", "",
                  "| backend | model | step time ms | epoch s | peak device MB | parameters | "
                  "loss path |", "|---|---|---|---|---|---|---|"]
        for r in fits:
            name = "ECOC k=128 + streaming loss" if r["kind"] == "ecoc" else "one-hot Dense(n)"
            lines.append(f"| {r['backend']} | {name} | {fmt(r['step_ms'])} | "
                         f"{fmt(r['epoch_s'], 2)} | {fmt(r.get('dev_peak_mb'))} | "
                         f"{r['params']:,} | {r['path'].split(':')[0]} |")
    if tiles:
        used = sorted({(r["backend"], r["B"], r["k"], r["n"], r["default_tile"]) for r in grid
                       if r.get("default_tile")})
        lines += ["", "### Classes per tile (streaming on the GPU, forward + backward w.r.t. z, "
                  "ms)", "", "Default tiles used in the grid above (`_dispatch.tile_size`, GPU "
                  "budget where it has one): " + ", ".join(
                      f"{bk} B={b} k={k} n={n}: {t}" for bk, b, k, n, t in used) + ".", ""]
        lines += _tile_table(tiles, args)
    if state["notes"] or state["skipped"]:
        lines += ["", "### Not measured", ""]
        lines += [f"- {x}" for x in state["notes"]]
        lines += [f"- skipped, --time-limit reached: {x}" for x in state["skipped"]]
    lines += ["", GPU_END]
    return "\n".join(lines) + "\n"


def main_gpu(args):
    """--device gpu: grid, then model.fit, then tiles; each finished subprocess is saved."""
    t0 = time.time()
    deadline = None if args.time_limit is None else t0 + args.time_limit
    if args.quick:
        args.grid = [(4, 8, 100), (4, 8, 10_000)]
        args.tile_sizes, args.tile_k, args.tile_n = [64, 256], 8, 1000
        args.max_repeats, args.budget = 2, 0.1
        args.fit_samples, args.fit_classes = 512, 2000
    else:
        args.grid = [(b, k, n) for b in (16, 256) for k in (32, 128)
                     for n in (1000, 10_000, 100_000, 1_000_000)]
        args.tile_sizes, args.tile_k, args.tile_n = [256, 1024, 4096, 16384], 64, 50_000
    # Ascending B·n: JAX's peak (which cannot be reset) grows with each cell, and
    # a worker stopped by its time limit loses only the largest, last cells.
    args.grid.sort(key=lambda c: (c[0] * c[2], c[1]))
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    flags = ["--device", "gpu"]
    if args.simulate_gpu:
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
        flags.append("--simulate-gpu")
    script = os.path.abspath(__file__)
    out = args.out
    json_path = None if out is None else os.path.splitext(out)[0] + ".json"
    state = {"device": "gpu", "simulated": args.simulate_gpu, "quick": args.quick,
             "status": "PARTIAL: still running, or stopped", "probe": {}, "grid": [], "fits": [], "tiles": [],
             "skipped": [], "notes": []}

    def save():
        state["elapsed_s"] = time.time() - t0
        if out:
            write_doc(render_gpu(state, args, state["elapsed_s"]), out, GPU_BEGIN, GPU_END)
            with open(json_path, "w") as f:
                json.dump(state, f, indent=1)

    probe = run([script, "--probe"], "jax", 180, env)
    state["probe"] = probe[0] if probe else {"error": "the probe subprocess printed nothing"}
    print(f"[{time.time() - t0:.0f} s] machine: {gpu_machine(state['probe'], args.simulate_gpu)}",
          flush=True)
    print("probe: " + json.dumps(state["probe"]), flush=True)
    backends = []
    for b in args.backends.split(","):
        if args.simulate_gpu or state["probe"].get(f"{b}_gpu"):
            backends.append(b)
        else:
            why = state["probe"].get(f"{b}_error") or (
                "PyTorch sees no CUDA GPU (torch.cuda.is_available() is False)" if b == "torch"
                else f"JAX's default backend is {state['probe'].get('jax_backend')!r}, not 'gpu'")
            state["notes"].append(f"{b}: not run, {why}")
    if not backends:
        msg = ("bench_streaming --device gpu: no GPU for any of --backends="
               f"{args.backends}: " + "; ".join(state["notes"]) + ". Nothing was measured.")
        print(msg, file=sys.stderr)
        state["status"] = "no GPU: nothing measured"
        save()
        return 2
    common = ["--budget", str(args.budget), "--max-repeats", str(args.max_repeats), *flags]
    tasks = []
    for b in backends:
        for m in METHODS[b]:
            tasks.append(("grid", f"{b}:{m}", b, 300, len(args.grid),
                          [script, "--worker", f"{b}:{m}", "--configs", json.dumps(args.grid),
                           *common]))
    if not args.no_fit:
        for b in backends:
            for kind in ("ecoc", "onehot"):
                tasks.append(("fits", f"{b} fit {kind}", b, 300, 1,
                              [script, "--fit-worker", kind, "--fit-samples",
                               str(args.fit_samples), "--fit-classes", str(args.fit_classes),
                               *flags]))
    if not args.no_tiles:
        cfgs = json.dumps([(b, args.tile_k, args.tile_n, c) for b in (16, 256)
                           for c in args.tile_sizes])
        for b in backends:
            tasks.append(("tiles", f"{b} tiles", b, 200, 2 * len(args.tile_sizes),
                          [script, "--worker", f"{b}:stream", "--configs", cfgs, *common]))
    save()
    # Under --time-limit each subprocess gets at most 1.5x its share of the time
    # left (a grid worker weighs 3, a fit or tile worker 1), so one slow worker
    # (say, a first torch.compile) cannot starve all that follow; time a
    # worker does not use goes to the later ones.
    weight = {"grid": 3, "fits": 1, "tiles": 1}
    pending = sum(weight[t[0]] for t in tasks)
    for group, label, backend, limit, expected, cmd in tasks:
        left = None if deadline is None else deadline - time.time()
        share = None if left is None else 1.5 * left * weight[group] / pending
        pending -= weight[group]
        if left is not None and min(left, share) < 10:
            state["skipped"].append(label)
            print(f"[{time.time() - t0:.0f} s] {label}: skipped (--time-limit)", flush=True)
            continue
        timeout = limit if left is None else min(limit, left, share)
        st = {}
        res = run(cmd, backend, timeout, env, st)
        state[group] += res
        if st.get("timed_out"):
            state["notes"].append(f"{label}: stopped after {timeout:.0f} s with {len(res)} of "
                                  f"{expected} cells")
        elif len(res) < expected:
            state["notes"].append(f"{label}: exit code {st.get('rc')}, {len(res)} of {expected} "
                                  "cells (its stderr is in the log)")
        print(f"[{time.time() - t0:.0f} s] {label}: {len(res)} of {expected} cells", flush=True)
        save()
    state["status"] = "complete" if not (state["notes"] or state["skipped"]) else (
        "finished; see 'Not measured'")
    save()
    print(render_gpu(state, args, time.time() - t0))
    if out:
        print(f"wrote {out} and {json_path}")
    return 0 if state["grid"] else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None, help="Markdown file whose streaming section is "
                   "replaced (default docs/benchmarks.md; --quick prints only; with --device "
                   "gpu: the GPU section, plus every row as JSON in <out without .md>.json; "
                   "without --out the GPU run prints only)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu (default): the CPU tables; gpu: CUDA tensors / JAX GPU arrays")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds for the whole GPU run; what does not fit is skipped")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds of timed repeats per cell (default 1.0 on CPU, 0.5 on GPU)")
    p.add_argument("--max-repeats", type=int, default=None,
                   help="timed repeats per cell at most (default 5 on CPU, 30 on GPU)")
    p.add_argument("--backends", default=None, help="comma-separated: jax,torch,tensorflow "
                   "(default: all three on the CPU, jax,torch on the GPU)")
    p.add_argument("--no-fit", action="store_true")
    p.add_argument("--no-tiles", action="store_true")
    p.add_argument("--fit-samples", type=int, default=None,
                   help="examples per model.fit epoch (default 1024 on CPU, 8192 on GPU)")
    p.add_argument("--fit-classes", type=int, default=100_000, help=argparse.SUPPRESS)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--configs", default=None, help=argparse.SUPPRESS)
    p.add_argument("--fit-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    # Runs the --device gpu code path on CPU devices (tests without a GPU).
    p.add_argument("--simulate-gpu", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    allowed = GPU_BACKENDS if args.device == "gpu" else tuple(METHODS)
    if args.backends is None:
        args.backends = ",".join(allowed)
    for b in args.backends.split(","):
        if b not in allowed:
            p.error(f"Argument `--backends` must be a comma-separated subset of "
                    f"{','.join(allowed)} with --device {args.device}. "
                    f"Received: --backends={args.backends}")
    if args.time_limit is not None and not args.time_limit > 0:
        p.error(f"Argument `--time-limit` must be a positive number of seconds. "
                f"Received: --time-limit={args.time_limit}")
    gpu = args.device == "gpu"
    if args.budget is None:
        args.budget = 0.5 if gpu else 1.0
    if args.max_repeats is None:
        args.max_repeats = 30 if gpu else 5
    if args.fit_samples is None:
        args.fit_samples = 8192 if gpu else 1024
    if args.probe:
        probe_worker()
        return 0
    if args.worker:
        worker(args)
        return 0
    if args.fit_worker:
        fit_worker(args)
        return 0
    if gpu:
        return main_gpu(args)
    if args.quick:
        args.grid = [(4, 8, 100), (4, 8, 10_000)]
        args.tile_sizes, args.tile_k, args.tile_n = [64, 256], 8, 1000
        args.max_repeats, args.budget = 2, 0.1
        args.fit_samples = 512
    else:
        args.grid = [(b, k, n) for b in (16, 256) for k in (32, 128) for n in (1000, 10_000, 100_000)]
        args.tile_sizes, args.tile_k, args.tile_n = [256, 1024, 4096, 16384], 64, 50_000
    args.load_before = os.getloadavg()[0]
    t0 = time.time()
    grid, tiles, fits = [], [], []
    common = ["--budget", str(args.budget), "--max-repeats", str(args.max_repeats)]
    script = os.path.abspath(__file__)
    for backend in args.backends.split(","):
        for method in METHODS[backend]:
            cfgs = json.dumps(args.grid)
            res = run([script, "--worker", f"{backend}:{method}", "--configs", cfgs, *common],
                      backend, 900)
            grid += res
            print(f"[{time.time() - t0:.0f} s] {backend}:{method}: {len(res)} cells", flush=True)
        if backend == "tensorflow":
            continue  # the fallback: grid only (no tile table, no fit)
        if not args.no_tiles:
            cfgs = json.dumps([(b, args.tile_k, args.tile_n, c) for b in (16, 256)
                               for c in args.tile_sizes])
            res = run([script, "--worker", f"{backend}:stream", "--configs", cfgs, *common],
                      backend, 600)
            tiles += res
            print(f"[{time.time() - t0:.0f} s] {backend} tiles: {len(res)} cells", flush=True)
        if not args.no_fit and not args.quick:
            for kind in ("ecoc", "onehot"):
                fits += run([script, "--fit-worker", kind, "--fit-samples", str(args.fit_samples)],
                            backend, 600)
                print(f"[{time.time() - t0:.0f} s] {backend} fit {kind}", flush=True)
    section = render(grid, tiles, fits, time.time() - t0, args)
    print(section)
    out = args.out or (None if args.quick else os.path.join(ROOT, "docs", "benchmarks.md"))
    if out:
        write_doc(section, out)
        print(f"wrote {out}")
    return 0 if grid else 1


if __name__ == "__main__":
    sys.exit(main())
