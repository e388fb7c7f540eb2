#!/usr/bin/env python
"""Fused vs streaming vs dense ECOC loss on each Keras backend: forward+backward time and peak memory.

For every backend (a fresh interpreter each, KERAS_BACKEND set), batch size B,
code length k and class count n, and each path of
`keras_ecoc.ops.ecoc_cross_entropy` (forced with ``fused=True`` / ``fused=False``
and ``KERAS_ECOC_LOSS_PATH=streaming|dense``), one step computes the loss and
its gradient with respect to z and the scale (the codes fixed, as in ECOC
training) under the backend's compiler: ``jax.jit``, ``tf.function`` (graph
mode; the fused op runs its CPU kernel), PyTorch eagerly. Time: median of
`--reps` steps after one warm-up (compile) step, in wall-clock time and in
CPU time of the process (all its threads: the work a path does, which a
loaded machine changes far less than the wall-clock time). Peak memory: the rise of the
process's resident-set high-water mark (VmHWM, reset through
/proc/self/clear_refs before the warm-up) over its resident set before the
cell, so it includes compilation and every temporary, in MiB.

Dense cells whose B x n float32 logits would exceed `--dense-max-mb` are
skipped (the dense path holds several B x n arrays).

On a GPU (``--device gpu``, JAX and PyTorch only): the arrays live on the
GPU (JAX's default device must be a GPU; PyTorch tensors on ``cuda``), each
step ends with ``block_until_ready`` / ``torch.cuda.synchronize()`` before
the clock is read, the fused cells must be dispatched to the CUDA kernels
(the dispatcher is asked for the GPU), and each row adds the peak device
memory of the timed steps above the inputs (``dev_peak_mb``: PyTorch's
``max_memory_allocated`` after ``reset_peak_memory_stats``, exact; JAX's
``peak_bytes_in_use`` minus ``bytes_in_use`` before the warm-up, valid only
when the cell raised the process's peak, else None with
``dev_peak_masked``; JAX rows also carry ``xla_temp_mb``, the compiled
step's temporary buffers from XLA's memory analysis, for every cell).
``--time-limit`` bounds the whole run: each backend
gets an equal share of what is left, a cell that would start after its
backend's share is not run, and every cell not run is named in the JSON's
``skipped`` list and in the table. Without a GPU it says so in one line and
exits 2. The hidden ``--simulate-gpu`` runs this code path on the CPU (no
device statistics): how benchmarks/device_run_backends.sh is tested here.

Usage::

    python benchmarks/bench_fused_backends.py [--quick] [--backends jax,torch,tensorflow]
        [--batch 16,256] [--k 32,128] [--n 10000,100000,1000000] [--reps 3]
        [--big-reps 1] [--json rows.json] [--device cpu|gpu] [--time-limit S]
    python benchmarks/bench_fused_backends.py --render a.json,b.json

`--big-reps` applies to the n >= 10^6 cells (a streaming step there takes
minutes); `--json` writes the measured rows, `--render` prints the table of
rows written by earlier runs (e.g. one run per backend).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _rss_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _step_fn(backend, path, b, n, k, cuda=False, gpu=False):
    """A function running one forward+backward step, and a sync.

    cuda: PyTorch tensors on the GPU (JAX places them on its default device).
    gpu: the --device gpu code path (also simulated): JAX compiles here and
    the function carries ``xla_temp_mb``, XLA's temporary buffers of the step
    (the FFI handlers' scratch comes from XLA's allocator at run time and is
    not in it).
    """
    import numpy as np

    from keras_ecoc import ops as eops

    rng = np.random.default_rng(0)
    z = rng.normal(size=(b, k)).astype(np.float32)
    codes = np.sign(rng.normal(size=(n, k))).astype(np.float32) / np.sqrt(k)
    labels = rng.integers(0, n, size=b).astype(np.int32)
    fused = True if path == "fused" else False
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        c = jnp.asarray(codes)
        y = jnp.asarray(labels)

        def total(z, s):
            return jnp.sum(eops.ecoc_cross_entropy(y, z, c, s, fused=fused))

        f = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))
        zz, ss = jnp.asarray(z), jnp.float32(8.0)
        if not gpu:
            return lambda: jax.block_until_ready(f(zz, ss))
        # On the GPU: compiled here, so that XLA's own account of the
        # program's buffers is read for every cell (JAX's peak statistic
        # cannot be reset, so it is masked wherever an earlier cell peaked higher).
        compiled = f.lower(zz, ss).compile()

        def run():
            jax.block_until_ready(compiled(zz, ss))

        try:
            run.xla_temp_mb = compiled.memory_analysis().temp_size_in_bytes / 2**20
        except Exception:  # noqa: BLE001 - a backend without the analysis: no column
            pass
        return run
    if backend == "torch":
        import torch

        dev = torch.device("cuda" if cuda else "cpu")
        c = torch.tensor(codes, device=dev)
        y = torch.tensor(labels, device=dev).long()
        zz = torch.tensor(z, device=dev, requires_grad=True)
        ss = torch.tensor(8.0, device=dev, requires_grad=True)

        def run():
            zz.grad = None
            ss.grad = None
            torch.sum(eops.ecoc_cross_entropy(y, zz, c, ss, fused=fused)).backward()
            if cuda:  # the kernels run asynchronously: wait for them before the clock
                torch.cuda.synchronize()

        return run
    import tensorflow as tf

    c = tf.constant(codes)
    y = tf.constant(labels)

    @tf.function
    def step(z, s):
        with tf.GradientTape() as tape:
            tape.watch([z, s])
            loss = tf.reduce_sum(eops.ecoc_cross_entropy(y, z, c, s, fused=fused))
        return loss, tape.gradient(loss, [z, s])

    zz, ss = tf.constant(z), tf.constant(8.0)
    return lambda: [t.numpy() for t in tf.nest.flatten(step(zz, ss))]


def _device_memory(backend, simulate):
    """bench_streaming's peak-device-memory probe (the same rules, see its docstring)."""
    sys.path.insert(0, HERE)
    from bench_streaming import _DeviceMemory  # noqa: PLC0415 - only on the GPU path

    return _DeviceMemory(backend, simulate)


def worker(args):
    backend = os.environ["KERAS_BACKEND"]
    gpu = args.device == "gpu"
    cuda = gpu and not args.simulate_gpu
    if gpu:
        sys.path.insert(0, HERE)
        from bench_streaming import _gpu_env_ok  # noqa: PLC0415

        try:
            _gpu_env_ok(backend, args.simulate_gpu)
        except RuntimeError as e:
            print(f"NOGPU {backend}: {e}", flush=True)
            return 2

    cells = json.loads(args.cells)
    # Warm-up of every path at a tiny shape: library loads, imports and the
    # backend's own first-use costs stay out of the first measured cell.
    for path in sorted({c[3] for c in cells}):
        os.environ["KERAS_ECOC_LOSS_PATH"] = path if path != "fused" else "auto"
        try:
            _step_fn(backend, path, 4, 50 if path != "streaming" else 2000, 8, cuda, gpu)()
        except Exception:  # noqa: BLE001 - the measured cell reports the error
            pass
    for b, k, n, path in cells:
        if args.deadline and time.time() > args.deadline:
            # Named, not run: the parent lists it among the skipped cells.
            print("SKIP " + json.dumps([b, k, n, path, "time limit"]), flush=True)
            continue
        os.environ["KERAS_ECOC_LOSS_PATH"] = path if path != "fused" else "auto"
        row = {"backend": backend, "B": b, "k": k, "n": n, "path": path, "device": args.device}
        if args.simulate_gpu:
            row["simulated"] = True
        try:
            from keras_ecoc.ops import _dispatch

            chosen = _dispatch.choose(n, k, fused=path == "fused" or False)[0]
            if chosen != path:
                raise RuntimeError(f"the dispatcher chose {chosen}")
            base = _rss_mb("VmRSS")
            hwm_ok = _reset_hwm()
            run = _step_fn(backend, path, b, n, k, cuda, gpu)
            mem = _device_memory(backend, args.simulate_gpu) if gpu else None
            if mem:
                mem.before_warmup()
            t0 = time.perf_counter()
            run()  # warm-up / compile
            row["first_s"] = time.perf_counter() - t0
            if mem:
                mem.before_timed()
            times, cpu = [], []
            for _ in range(args.big_reps if n >= 10**6 else args.reps):
                t0, c0 = time.perf_counter(), time.process_time()
                run()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            times.sort()
            cpu.sort()
            row["ms"] = 1e3 * times[len(times) // 2]
            row["cpu_ms"] = 1e3 * cpu[len(cpu) // 2]
            row["reps"] = len(times)
            row["load1"] = os.getloadavg()[0]
            if backend == "torch" and path == "fused":
                from keras_ecoc.ops import _fused_torch

                # Where the CPU kernels' loops ran: PyTorch's OpenMP team or
                # per-call std::threads (KERAS_ECOC_TORCH_CPU_POOL=threads).
                row["cpu_pool"] = _fused_torch.cpu_pool()
            row["peak_mb"] = (_rss_mb("VmHWM") - base) if hwm_ok else None
            if mem:
                row.update(mem.result())
            if hasattr(run, "xla_temp_mb"):
                row["xla_temp_mb"] = run.xla_temp_mb
        except Exception as e:  # noqa: BLE001 - report the cell, go on
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        print("ROW " + json.dumps(row), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="jax,torch,tensorflow")
    p.add_argument("--batch", default="16,256")
    p.add_argument("--k", default="32,128")
    p.add_argument("--n", default="10000,100000,1000000")
    p.add_argument("--paths", default="fused,streaming,dense")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--big-reps", type=int, default=1, help="timed steps of the n >= 1e6 cells")
    p.add_argument("--json", default=None, help="write the measured rows to this file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json")
    p.add_argument("--render", default=None, help="comma-separated JSON files: print their table")
    p.add_argument("--dense-max-mb", type=float, default=256.0)
    p.add_argument("--quick", action="store_true",
                   help="n = 1e6 only at B = 16, k = 32")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"),
                   help="gpu: arrays on the GPU, synchronised timing, peak device memory "
                        "(JAX and PyTorch only)")
    p.add_argument("--time-limit", type=float, default=0.0,
                   help="seconds for the whole run (0: none); cells that do not fit are skipped "
                        "and named")
    p.add_argument("--grace", type=float, default=20.0,
                   help="seconds a cell may run past its backend's share of --time-limit")
    p.add_argument("--simulate-gpu", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cells", default="[]", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.render:
        rows, skipped = [], []
        for path in args.render.split(","):
            with open(path) as f:
                saved = json.load(f)
            rows += saved["rows"]
            skipped += [tuple(c) for c in saved["skipped"]]
        args.backends = ",".join(dict.fromkeys(r["backend"] for r in rows))
        render(rows, skipped, args)
        return 0
    backends = args.backends.split(",")
    if not set(backends) <= {"tensorflow", "jax", "torch"}:
        p.error("Argument `--backends` must be a comma-separated subset of tensorflow,jax,torch. "
                f"Received: --backends={args.backends}")
    if not set(args.paths.split(",")) <= {"fused", "streaming", "dense"}:
        p.error("Argument `--paths` must be a comma-separated subset of fused,streaming,dense. "
                f"Received: --paths={args.paths}")
    # Parsed once, here: --n also takes 1e6, --batch and --k integers only.
    parsed = {}
    for flag, parse in (("batch", int), ("k", int), ("n", lambda x: int(float(x)))):
        try:
            parsed[flag] = [parse(x) for x in getattr(args, flag).split(",")]
        except ValueError:
            parsed[flag] = [0]
        if min(parsed[flag]) < 1:
            p.error(f"Argument `--{flag}` must be comma-separated positive integers. "
                    f"Received: --{flag}={getattr(args, flag)}")
    if args.reps < 1 or args.big_reps < 1:
        p.error(f"Arguments `--reps` and `--big-reps` must be positive integers. "
                f"Received: --reps={args.reps} --big-reps={args.big_reps}")
    if args.json and os.path.exists(args.json) and not args.overwrite:
        p.error(f"{args.json} exists; pass --overwrite to replace it")
    if args.device == "gpu" and not set(backends) <= {"jax", "torch"}:
        p.error("with --device gpu, argument `--backends` must be a comma-separated subset of "
                f"jax,torch. Received: --backends={args.backends}")
    if args.time_limit < 0:
        p.error(f"Argument `--time-limit` must be >= 0 seconds. Received: --time-limit={args.time_limit}")
    t_start = time.time()
    bs, ks, ns = parsed["batch"], parsed["k"], parsed["n"]
    paths = args.paths.split(",")
    cells, skipped = [], []
    for b in bs:
        for k in ks:
            for n in ns:
                if args.quick and n >= 10**6 and (b, k) != (16, 32):
                    continue
                for path in paths:
                    if path == "dense" and b * n * 4 / 2**20 > args.dense_max_mb:
                        skipped.append((b, k, n, path, f"dense logits over {args.dense_max_mb:g} MiB"))
                        continue
                    cells.append((b, k, n, path))
    # Measured in the order issue 17 needs them, so that a time limit cuts the
    # least useful cells: n = 1e5 first, then n >= 1e6 (every B and k of one n
    # before the next n: the H100 run of 2026-11-26, B-major, reached no
    # B = 256 cell in 30 s), then the smaller n; within a cell the paths in
    # --paths order.
    cells.sort(key=lambda c: (0 if c[2] == 10**5 else 1 if c[2] > 10**5 else 2, c[2], c[0], c[1],
                              paths.index(c[3])))
    rows, no_gpu = [], []
    for i, backend in enumerate(backends):
        env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT + os.pathsep + os.environ.get(
            "PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="3")
        deadline = 0.0
        if args.time_limit:
            # An equal share of what is left for this and each later backend.
            left = args.time_limit - (time.time() - t_start)
            deadline = time.time() + left / (len(backends) - i)
        errf = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty stderr cannot block
        cmd = [sys.executable, __file__, "--worker", "--cells", json.dumps(cells),
               "--reps", str(args.reps), "--big-reps", str(args.big_reps), "--device", args.device,
               "--deadline", repr(deadline)]
        if args.simulate_gpu:
            cmd.append("--simulate-gpu")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=errf, text=True)
        done, here_no_gpu = set(), False
        if deadline:
            # A cell still running at the deadline (+ a grace for its last
            # step) is stopped; the killed worker's stdout then ends.
            killer = threading.Timer(max(deadline - time.time(), 0) + args.grace, proc.kill)
            killer.daemon = True
            killer.start()
        for line in proc.stdout:  # rows as they come: a run cut short keeps its rows
            if line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
                done.add((rows[-1]["B"], rows[-1]["k"], rows[-1]["n"], rows[-1]["path"]))
                _save(args.json, rows, skipped)
            elif line.startswith("SKIP "):
                b, k, n, path, why = json.loads(line[5:])
                skipped.append((b, k, n, path, f"{backend}: {why}"))
                done.add((b, k, n, path))
                _save(args.json, rows, skipped)
            elif line.startswith("NOGPU "):
                no_gpu.append(line[6:].strip())
                here_no_gpu = True
        rc = proc.wait()
        if deadline:
            killer.cancel()
        for cell in cells:
            if cell not in done and not here_no_gpu:
                why = ("time limit (worker stopped)" if rc < 0 and deadline
                       else f"worker exited with {rc}")
                skipped.append((*cell, f"{backend}: {why}"))
        errf.seek(0)
        err = errf.read()
        if not done and not here_no_gpu:
            print(f"{backend}: worker failed\n{err[-3000:]}", file=sys.stderr)
    _save(args.json, rows, skipped, no_gpu)
    if no_gpu and not rows:
        print(f"bench_fused_backends --device gpu: no GPU: {'; '.join(no_gpu)}", file=sys.stderr)
        return 2
    for line in no_gpu:
        print(f"no GPU: {line}", file=sys.stderr)
    render(rows, skipped, args)
    return 0


def _save(path, rows, skipped, no_gpu=()):
    if path:
        with open(path, "w") as f:
            json.dump({"rows": rows, "skipped": skipped, "no_gpu": list(no_gpu),
                       "argv": sys.argv[1:]}, f, indent=1)
    return 0


def _skip_reasons(skipped):
    """{(backend or None, B, k, n, path): why} from the JSON's skipped list.

    Entries are [B, k, n, path] (older files) or [B, k, n, path, why], where a
    why of the form "<backend>: ..." concerns that backend only.
    """
    out = {}
    for c in skipped:
        why = c[4] if len(c) > 4 else "skipped"
        head = why.split(":", 1)[0]
        backend = head if head in ("jax", "torch", "tensorflow") else None
        out[(backend, *c[:4])] = why
    return out


def render(rows, skipped, args):
    by = {(r["backend"], r["B"], r["k"], r["n"], r["path"]): r for r in rows}
    why = _skip_reasons(skipped)
    backends = args.backends.split(",")
    paths = args.paths.split(",")
    keys = sorted({(r["B"], r["k"], r["n"]) for r in rows} | {tuple(c[:3]) for c in skipped})
    fields = [("ms", "ms"), ("cpu_ms", "CPU ms"), ("peak_mb", "MiB")]
    if any("dev_peak_mb" in r for r in rows):  # --device gpu rows
        fields = [("ms", "ms"), ("dev_peak_mb", "device MiB"), ("peak_mb", "host MiB")]
        if any("xla_temp_mb" in r for r in rows):  # JAX: XLA's temporaries, never masked
            fields.insert(2, ("xla_temp_mb", "XLA temp MiB"))
    head = ["backend", "B", "k", "n"] + [f"{p} {label}" for _, label in fields for p in paths]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for backend in backends:
        for b, k, n in keys:
            cells = [backend, str(b), str(k), f"{n:.0e}".replace("e+0", "e")]
            for field, _ in fields:
                for path in paths:
                    r = by.get((backend, b, k, n, path))
                    if r is None:
                        skip = (backend, b, k, n, path) in why or (None, b, k, n, path) in why
                        cells.append("skipped" if skip else "-")
                    elif "error" in r and "ms" not in r:
                        cells.append("error")
                    elif field == "dev_peak_mb" and r.get("dev_peak_masked"):
                        cells.append("masked")  # an earlier cell's JAX peak was higher
                    else:
                        v = r.get(field)
                        cells.append("-" if v is None else (f"{v:.1f}" if v < 100 else f"{v:.0f}"))
            lines.append("| " + " | ".join(cells) + " |")
    if any(r.get("simulated") for r in rows):
        lines.append("\nSIMULATED (--simulate-gpu): the GPU code path on the CPU; not GPU numbers.")
    named = sorted(why.items(), key=lambda kv: (str(kv[0][0]), kv[0][1:]))
    if named:
        lines.append("\nSkipped cells: " + "; ".join(
            f"B={b} k={k} n={n:g} {path} ({w})" for (_, b, k, n, path), w in named))
    print("\n".join(lines))
    errors = [r for r in rows if "error" in r]
    for r in errors:
        print(f"# {r['backend']} B={r['B']} k={r['k']} n={r['n']} {r['path']}: {r['error']}",
              file=sys.stderr)

if __name__ == "__main__":
    sys.exit(main())
