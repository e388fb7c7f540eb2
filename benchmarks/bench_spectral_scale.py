"""Spectral codes at scale: time and peak memory of codes.spectral.

For each number of classes n, a fresh subprocess builds synthetic class
means (n x 256, float32, one sample per class), the 10-nearest-neighbour
cosine similarity with `codes.class_similarity(..., n_neighbors=10)` (the
"auto" search: exact up to 50,000 classes, faiss above) and the spectral
codes with `codes.spectral(graph, code_length)` (solver "auto", i.e. the
Chebyshev-filtered Lanczos solver). It reports the wall time of each stage,
the CPU time (user + system, all threads; less sensitive than the wall time
to other processes on the machine), the peak RSS of the process, and the peak RSS above the RSS once the means
exist (the inputs), plus two checks of quality:

- recall@10 of the neighbour search: the fraction of the exact 10 nearest
  neighbours (brute force, float64, on 1,000 sampled classes) that the graph
  links to;
- the largest eigen-residual `|L m - lambda m| / sqrt(n)` over the code
  columns `m` (normalization "sqrt_n").

The means lie near a 16-dimensional subspace, as class embeddings do: a
latent vector per class (one of sqrt(n) overlapping Gaussian groups plus its
own N(0, I) offset) mapped to 256 dimensions by a random Gaussian matrix,
plus N(0, 4 I) noise in all 256 dimensions. The groups overlap, so the
10-neighbour graph is connected (the table gives the components).

Each finished n is appended to the JSON results file at once, so a killed
run keeps what had finished. Run niced; numbers depend on what else runs on
the machine.

    nice -n 5 python benchmarks/bench_spectral_scale.py \
        --sizes 100000 1000000 --out docs/results/spectral_scale.json
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _rss_mib():
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s():
    # User + system time of all threads of this process: unlike the wall
    # time, hardly affected by other processes competing for the cores.
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _reset_peak():
    # Writing 5 to clear_refs resets the VmHWM ("peak RSS") of the process,
    # so that the peak of the measured stages excludes the start-up.
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False


def _hwm_mib():
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return _peak_mib()


def _class_means(n, dim, seed, latent_dim=16):
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    groups = max(2, int(np.sqrt(n)))
    latent = rng.standard_normal((groups, latent_dim), dtype=np.float32)[
        rng.integers(0, groups, n)
    ]
    latent += rng.standard_normal((n, latent_dim), dtype=np.float32)
    mixing = rng.standard_normal((latent_dim, dim), dtype=np.float32)
    means = latent @ mixing
    del latent
    means += 2.0 * rng.standard_normal((n, dim), dtype=np.float32)
    return means


def child(n, dim, code_length, n_neighbors, seed):
    import numpy as np  # noqa: PLC0415
    import scipy.sparse  # noqa: PLC0415
    import scipy.sparse.csgraph  # noqa: PLC0415

    sys.path.insert(0, ROOT)
    from keras_ecoc import codes as ecoc_codes  # noqa: PLC0415

    rss_import = _rss_mib()
    means = _class_means(n, dim, seed)
    labels = np.arange(n)
    rss_inputs = _rss_mib()
    reset = _reset_peak()
    load_at_start = os.getloadavg()[0]

    start, cpu = time.perf_counter(), _cpu_s()
    graph = ecoc_codes.class_similarity(
        means, labels, kernel="cosine", n_neighbors=n_neighbors
    )
    similarity_s = time.perf_counter() - start
    similarity_cpu_s = _cpu_s() - cpu
    start, cpu = time.perf_counter(), _cpu_s()
    codes, eigenvalues = ecoc_codes.spectral(
        graph, code_length, return_eigenvalues=True
    )
    spectral_s = time.perf_counter() - start
    spectral_cpu_s = _cpu_s() - cpu
    peak = _hwm_mib() if reset else _peak_mib()

    # Quality checks, after the peak is read.
    rng = np.random.default_rng(seed + 1)
    sample = rng.choice(n, size=min(n, 1000), replace=False)
    unit = means.astype(np.float64)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    found = 0
    for block in np.array_split(sample, 10):
        scores = unit[block] @ unit.T
        scores[np.arange(len(block)), block] = -np.inf
        exact = np.argpartition(-scores, n_neighbors, axis=1)[:, :n_neighbors]
        for row, truth in zip(block, exact):
            linked = graph.indices[graph.indptr[row] : graph.indptr[row + 1]]
            found += np.isin(truth, linked).sum()
    recall = found / (len(sample) * n_neighbors)
    m = codes.astype(np.float64)
    inv_sqrt = scipy.sparse.diags(1 / np.sqrt(np.asarray(graph.sum(axis=1)).ravel()))
    laplacian_m = m - inv_sqrt @ (graph @ (inv_sqrt @ m))
    residual = float(
        (np.linalg.norm(laplacian_m - m * eigenvalues, axis=0) / np.sqrt(n)).max()
    )
    components = scipy.sparse.csgraph.connected_components(graph, directed=False)[0]
    return {
        "n": n,
        "components": int(components),
        "dim": dim,
        "code_length": code_length,
        "n_neighbors": n_neighbors,
        "edges": int(graph.nnz),
        "similarity_s": round(similarity_s, 1),
        "spectral_s": round(spectral_s, 1),
        "total_s": round(similarity_s + spectral_s, 1),
        "similarity_cpu_s": round(similarity_cpu_s, 1),
        "spectral_cpu_s": round(spectral_cpu_s, 1),
        "rss_after_import_mib": round(rss_import),
        "rss_inputs_mib": round(rss_inputs),
        "peak_rss_mib": round(peak),
        "peak_above_inputs_mib": round(peak - rss_inputs),
        "recall_at_10": round(float(recall), 4),
        "max_eigen_residual": residual,
        "eigenvalue_range": [float(eigenvalues[0]), float(eigenvalues[-1])],
        "cpu_count": os.cpu_count(),
        "load_average_1min_at_start": load_at_start,
        "load_average_1min_at_end": os.getloadavg()[0],
    }


def render(results):
    lines = [
        "| n | k | kNN edges | similarity (s) | spectral (s) | total (s) | "
        "CPU similarity + spectral (s) | "
        "peak RSS (MiB) | peak above inputs (MiB) | recall@10 | "
        "max residual | components | load at end |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['n']:,} | {r['code_length']} | {r['error']} |")
            continue
        lines.append(
            f"| {r['n']:,} | {r['code_length']} | {r['edges']:,} | "
            f"{r['similarity_s']:.1f} | {r['spectral_s']:.1f} | "
            f"{r['total_s']:.1f} | "
            f"{r['similarity_cpu_s']:.0f} + {r['spectral_cpu_s']:.0f} | "
            f"{r['peak_rss_mib']:,} | "
            f"{r['peak_above_inputs_mib']:,} | {r['recall_at_10']:.4f} | "
            f"{r['max_eigen_residual']:.1e} | {r['components']} | "
            f"{r['load_average_1min_at_end']:.1f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--code-length", type=int, default=64)
    parser.add_argument("--n-neighbors", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "spectral_scale.json"),
                        help="JSON of the rows, rewritten after each n (default: the "
                        "committed docs/results/spectral_scale.json)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is None:
        bad = [n for n in args.sizes if n < 2]
        if bad or args.dim < 1 or args.code_length < 1 or args.n_neighbors < 1:
            parser.error("Arguments --sizes (each >= 2), --dim, --code-length and "
                         "--n-neighbors must be positive integers. Received: "
                         f"--sizes {args.sizes} --dim {args.dim} --code-length "
                         f"{args.code_length} --n-neighbors {args.n_neighbors}")
        if os.path.exists(args.out) and not args.overwrite:
            parser.error(f"{args.out} exists; pass --overwrite to replace it (or "
                         "--out another file)")

    if args.child is not None:
        result = child(args.child, args.dim, args.code_length, args.n_neighbors, args.seed)
        print("RESULT " + json.dumps(result), flush=True)
        return

    results = []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for n in args.sizes:
        command = [
            sys.executable, os.path.abspath(__file__), "--child", str(n),
            "--dim", str(args.dim), "--code-length", str(args.code_length),
            "--n-neighbors", str(args.n_neighbors), "--seed", str(args.seed),
        ]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=args.timeout, env=env
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if lines:
                result = json.loads(lines[-1][len("RESULT "):])
            else:
                tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
                result = {"n": n, "code_length": args.code_length,
                          "error": f"exit {done.returncode}: {tail[0][:200]}"}
        except subprocess.TimeoutExpired:
            result = {"n": n, "code_length": args.code_length,
                      "error": f"timed out after {args.timeout:.0f} s"}
        results.append(result)
        with open(args.out, "w") as file:
            json.dump(results, file, indent=1)
        print(render(results[-1:]).splitlines()[-1], flush=True)
    print()
    print(render(results))


if __name__ == "__main__":
    main()
