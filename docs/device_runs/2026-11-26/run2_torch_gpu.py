import os, sys, time, json
import torch
T0 = time.time()
def log(*a):
    print(f"[{time.time()-T0:6.1f}s]", *a, flush=True)
from keras_ecoc.ops import _streaming_torch as st, _dispatch
dev = "cuda"
def problem(b, k, n):
    g = torch.Generator(device="cpu").manual_seed(0)
    z = torch.randn(b, k, generator=g).to(dev).requires_grad_(True)
    c = torch.randn(n, k, generator=g).to(dev)
    y = torch.randint(0, n, (b,), generator=g).to(dev)
    return z, c, y, torch.ones(b, dtype=torch.bool, device=dev), torch.tensor(4.0, device=dev)
def bench(b, k, n, tile, reps=20):
    z, c, y, v, s = problem(b, k, n)
    def step():
        z.grad = None
        st.cross_entropy(z, c, y, v, s, tile).sum().backward()
    torch.cuda.synchronize(); t = time.time(); step(); torch.cuda.synchronize(); first = time.time() - t
    base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    ts.sort()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return dict(B=b, k=k, n=n, tile=tile, first_s=round(first, 2), ms=round(1e3 * ts[len(ts)//2], 3), peak_mb=round(peak, 2), loop=st.compile_status())
cfgs = [(16, 32, 10_000), (256, 128, 100_000), (16, 128, 1_000_000), (256, 128, 1_000_000)]
mode = sys.argv[1]
if mode == "loop":
    os.environ[st.ENV_COMPILE] = "0"
for b, k, n in cfgs:
    tiles = [_dispatch.tile_size(b, n, k, "torch", on_gpu=True)]
    if mode == "loop" or (b, k, n) == (256, 128, 1_000_000):
        tiles += [65536]
    for tile in tiles:
        log(mode, json.dumps(bench(b, k, n, min(tile, n))))
