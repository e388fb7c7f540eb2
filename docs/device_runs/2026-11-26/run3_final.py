import json, os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import bench_streaming as bs
from keras_ecoc.ops import _dispatch
backend = sys.argv[1]
methods = {"jax": ("stream", "dense"), "torch": ("stream", "eager", "compiled")}[backend]
for b, k, n in [(16, 128, 100_000), (256, 128, 100_000), (16, 32, 1_000_000), (256, 128, 1_000_000)]:
    for method in methods:
        tile = _dispatch.tile_size(b, n, k, backend, on_gpu=True)
        step, info = bs.make_step(backend, method, b, k, n, tile if method == "stream" else None, "gpu")
        res = bs.measure_gpu(step, 0.3, 15, backend, False)
        del step
        res.update(info, B=b, k=k, n=n, tile=tile if method == "stream" else None, backend=backend, method=method)
        print(json.dumps(res), flush=True)
