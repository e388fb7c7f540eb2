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

Usage::

    python benchmarks/bench_fused_backends.py [--quick] [--backends jax,torch,tensorflow]
        [--batch 16,256] [--k 32,128] [--n 10000,100000,1000000] [--reps 3]
        [--big-reps 1] [--json rows.json]
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


def _step_fn(backend, path, b, n, k):
    """A function running one forward+backward step, and a sync."""
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
        return lambda: jax.block_until_ready(f(zz, ss))
    if backend == "torch":
        import torch

        c = torch.tensor(codes)
        y = torch.tensor(labels).long()
        zz = torch.tensor(z, requires_grad=True)
        ss = torch.tensor(8.0, requires_grad=True)

        def run():
            zz.grad = None
            ss.grad = None
            torch.sum(eops.ecoc_cross_entropy(y, zz, c, ss, fused=fused)).backward()

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


def worker(args):
    backend = os.environ["KERAS_BACKEND"]
    from keras_ecoc import ops as eops

    cells = json.loads(args.cells)
    # Warm-up of every path at a tiny shape: library loads, imports and the
    # backend's own first-use costs stay out of the first measured cell.
    for path in sorted({c[3] for c in cells}):
        os.environ["KERAS_ECOC_LOSS_PATH"] = path if path != "fused" else "auto"
        try:
            _step_fn(backend, path, 4, 50 if path != "streaming" else 2000, 8)()
        except Exception:  # noqa: BLE001 - the measured cell reports the error
            pass
    for b, k, n, path in cells:
        os.environ["KERAS_ECOC_LOSS_PATH"] = path if path != "fused" else "auto"
        row = {"backend": backend, "B": b, "k": k, "n": n, "path": path}
        try:
            from keras_ecoc.ops import _dispatch

            chosen = _dispatch.choose(n, k, fused=path == "fused" or False)[0]
            if chosen != path:
                raise RuntimeError(f"the dispatcher chose {chosen}")
            base = _rss_mb("VmRSS")
            hwm_ok = _reset_hwm()
            run = _step_fn(backend, path, b, n, k)
            t0 = time.perf_counter()
            run()  # warm-up / compile
            row["first_s"] = time.perf_counter() - t0
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
        except Exception as e:  # noqa: BLE001 - report the cell, go on
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        print("ROW " + json.dumps(row), flush=True)


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
    p.add_argument("--render", default=None, help="comma-separated JSON files: print their table")
    p.add_argument("--dense-max-mb", type=float, default=256.0)
    p.add_argument("--quick", action="store_true",
                   help="n = 1e6 only at B = 16, k = 32")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cells", default="[]", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
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
    bs = [int(x) for x in args.batch.split(",")]
    ks = [int(x) for x in args.k.split(",")]
    ns = [int(float(x)) for x in args.n.split(",")]
    paths = args.paths.split(",")
    cells, skipped = [], []
    for b in bs:
        for k in ks:
            for n in ns:
                if args.quick and n >= 10**6 and (b, k) != (16, 32):
                    continue
                for path in paths:
                    if path == "dense" and b * n * 4 / 2**20 > args.dense_max_mb:
                        skipped.append((b, k, n, path))
                        continue
                    cells.append((b, k, n, path))
    rows = []
    for backend in args.backends.split(","):
        env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT + os.pathsep + os.environ.get(
            "PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="3")
        errf = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty stderr cannot block
        proc = subprocess.Popen([sys.executable, __file__, "--worker", "--cells", json.dumps(cells),
                                 "--reps", str(args.reps), "--big-reps", str(args.big_reps)],
                                env=env, stdout=subprocess.PIPE, stderr=errf, text=True)
        got = 0
        for line in proc.stdout:  # rows as they come: a run cut short keeps its rows
            if line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
                got += 1
                _save(args.json, rows, skipped)
        proc.wait()
        errf.seek(0)
        err = errf.read()
        if not got:
            print(f"{backend}: worker failed\n{err[-3000:]}", file=sys.stderr)
    _save(args.json, rows, skipped)
    render(rows, skipped, args)


def _save(path, rows, skipped):
    if path:
        with open(path, "w") as f:
            json.dump({"rows": rows, "skipped": skipped, "argv": sys.argv[1:]}, f, indent=1)
    return 0


def render(rows, skipped, args):
    by = {(r["backend"], r["B"], r["k"], r["n"], r["path"]): r for r in rows}
    backends = args.backends.split(",")
    paths = args.paths.split(",")
    keys = sorted({(r["B"], r["k"], r["n"]) for r in rows})
    head = (["backend", "B", "k", "n"] + [f"{p} ms" for p in paths]
            + [f"{p} CPU ms" for p in paths] + [f"{p} MiB" for p in paths])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for backend in backends:
        for b, k, n in keys:
            cells = [backend, str(b), str(k), f"{n:.0e}".replace("e+0", "e")]
            for field in ("ms", "cpu_ms", "peak_mb"):
                for path in paths:
                    r = by.get((backend, b, k, n, path))
                    if r is None:
                        cells.append("skipped" if (b, k, n, path) in skipped else "-")
                    elif "error" in r and "ms" not in r:
                        cells.append("error")
                    else:
                        v = r.get(field)
                        cells.append("-" if v is None else (f"{v:.1f}" if v < 100 else f"{v:.0f}"))
            lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    errors = [r for r in rows if "error" in r]
    for r in errors:
        print(f"# {r['backend']} B={r['B']} k={r['k']} n={r['n']} {r['path']}: {r['error']}",
              file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
