"""One jitted fused ECOC loss + gradient on the GPU, against float64 NumPy.

The `status` phase of benchmarks/device_run_backends.sh runs this once per
backend (KERAS_BACKEND=jax, then =torch). Saying that the dispatcher *would*
take the fused path is not enough: on the H100 of 2026-11-26 it did, and every
JAX fused call then failed with "RESOURCE_EXHAUSTED: keras_ecoc: no FFI
scratch memory for the CUDA workspace". So this script calls the fused path
(`ecoc_cross_entropy(..., fused=True)`) inside `jax.jit` (JAX) or on CUDA
tensors (PyTorch), takes the gradient with respect to z, and compares loss and
gradient with a float64 NumPy reference at a tiny shape (B = 8, k = 16,
n = 1000, s = 10).

    KERAS_BACKEND=jax python benchmarks/device_fused_check.py

Prints one line per check and exits 0 when the call ran on the GPU through the
CUDA kernels and matched the reference, 1 naming the error otherwise (the
exception's type and message), 2 when the backend sees no GPU. The hidden
``--simulate-gpu`` runs the same code on the CPU (the CPU kernels), for the
tests; there, DEVICE_FUSED_CHECK_FAULT="message" replaces the fused module's
`cross_entropy` with one that raises RuntimeError(message), so that a test
can show that a raising fused call fails the check.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

B, K, N, SCALE = 8, 16, 1000, 10.0
# 3xTF32 (the default math mode) is float32-accurate; the loss sums over 1000
# classes and the check must not flake on a near-tie.
RTOL, ATOL = 2e-4, 2e-5


def reference(z, codes, labels, scale):
    """Float64 mean loss and its gradient with respect to z (B, k).

    u = z / ||z||, logits_i = -s/2 ||M_i - u||^2, loss = logsumexp - logit_y.
    d loss / d u = s (E_p[M] - M_y) (the u terms cancel since sum(p - y) = 0),
    d u / d z = (I - u u^T) / ||z||.
    """
    z = z.astype(np.float64)
    codes = codes.astype(np.float64)
    norm = np.linalg.norm(z, axis=1, keepdims=True)
    u = z / norm
    d2 = ((codes[None, :, :] - u[:, None, :]) ** 2).sum(-1)  # (B, n)
    logits = -0.5 * scale * d2
    m = logits.max(1, keepdims=True)
    p = np.exp(logits - m)
    lse = np.log(p.sum(1, keepdims=True)) + m
    p /= p.sum(1, keepdims=True)
    rows = np.arange(len(labels))
    loss = (lse[:, 0] - logits[rows, labels]).mean()
    g_u = scale * (p @ codes - codes[labels]) / len(labels)
    g_z = (g_u - u * (u * g_u).sum(1, keepdims=True)) / norm
    return loss, g_z


def _inject_fault(backend):
    message = os.environ.get("DEVICE_FUSED_CHECK_FAULT")
    if not message:
        return
    from keras_ecoc import ops  # noqa: PLC0415

    mod = ops._fused_module(backend)

    def raising(*args, **kwargs):
        raise RuntimeError(message)

    mod.cross_entropy = raising


def run_jax(z, codes, labels, simulate):
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from keras_ecoc import ops  # noqa: PLC0415

    if not simulate and jax.default_backend() != "gpu":
        return None, f"JAX sees no GPU (default backend {jax.default_backend()})"

    @jax.jit
    def loss_and_grad(z, codes, labels):
        return jax.value_and_grad(
            lambda z: jnp.mean(ops.ecoc_cross_entropy(labels, z, codes, SCALE, fused=True)))(z)

    loss, grad = loss_and_grad(jnp.asarray(z), jnp.asarray(codes), jnp.asarray(labels))
    loss, grad = jax.block_until_ready((loss, grad))
    return (float(loss), np.asarray(grad), str(grad.devices())), None


def run_torch(z, codes, labels, simulate):
    import torch  # noqa: PLC0415

    from keras_ecoc import ops  # noqa: PLC0415

    if not simulate and not torch.cuda.is_available():
        return None, "torch.cuda.is_available() is False"
    device = "cpu" if simulate else "cuda"
    zt = torch.tensor(z, device=device, requires_grad=True)
    loss = ops.ecoc_cross_entropy(torch.tensor(labels, device=device), zt,
                                  torch.tensor(codes, device=device), SCALE, fused=True).mean()
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
    return (float(loss.detach().cpu()), zt.grad.detach().cpu().numpy(), str(zt.grad.device)), None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--simulate-gpu", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    backend = os.environ.get("KERAS_BACKEND", "")
    if backend not in ("jax", "torch"):
        print(f"device_fused_check: KERAS_BACKEND must be jax or torch. Received: "
              f"KERAS_BACKEND={backend!r}", file=sys.stderr)
        return 3
    rng = np.random.default_rng(17)
    z = rng.normal(size=(B, K)).astype(np.float32)
    codes = (rng.normal(size=(N, K)) / np.sqrt(K)).astype(np.float32)
    labels = rng.integers(0, N, size=B).astype(np.int32)
    want_loss, want_grad = reference(z, codes, labels, SCALE)
    where = f"{backend} fused loss + gradient (B={B} k={K} n={N} s={SCALE:g})"
    try:
        if args.simulate_gpu:
            _inject_fault(backend)
        got, no_gpu = (run_jax if backend == "jax" else run_torch)(z, codes, labels,
                                                                  args.simulate_gpu)
    except Exception as e:  # noqa: BLE001 - the point: name whatever the call raised
        msg = " ".join(str(e).split())[:400]
        print(f"FAIL {where}: the call raised {type(e).__name__}: {msg}")
        return 1
    if no_gpu:
        print(f"NO GPU {where}: {no_gpu}")
        return 2
    loss, grad, device = got
    loss_err = abs(loss - want_loss)
    grad_err = float(np.max(np.abs(grad - want_grad)))
    grad_tol = ATOL + RTOL * float(np.max(np.abs(want_grad)))
    ok = (loss_err <= ATOL + RTOL * abs(want_loss) and grad_err <= grad_tol
          and bool(np.all(np.isfinite(grad))))
    print(f"{'pass' if ok else 'FAIL'} {where} on {device}: loss {loss:.6f} (float64 "
          f"{want_loss:.6f}, |err| {loss_err:.2e}), max |grad err| {grad_err:.2e} "
          f"(tolerance {grad_tol:.2e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
