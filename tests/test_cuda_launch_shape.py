"""The CUDA launchers' split rule (kernels/cuda/ecoc_launch_shape.h).

The header is host-only C++, so g++ compiles it into a small program here and
its answers are compared with a brute force written from the rule's
definition in exact integer arithmetic: the split count of least
waves x (longest split + block cost), fewest on a tie, within the wave cap.
"""

import itertools
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEADER = REPO / "kernels" / "cuda" / "ecoc_launch_shape.h"

BLOCK_COST_TILES = 1  # kBlockCostTiles
MAX_SPLIT_WAVES = 4  # kMaxSplitWaves
MAX_SPLITS = 1024  # kMaxSplits in ecoc_kernels.cu.cc

_MAIN = r"""
#include <cstdio>
#include "ecoc_launch_shape.h"
int main() {
  long long other, tiles, slots, max_splits, max_waves;
  while (std::scanf("%lld %lld %lld %lld %lld", &other, &tiles, &slots, &max_splits,
                    &max_waves) == 5) {
    std::printf("%lld\n", static_cast<long long>(keras_ecoc::cuda::launch_shape::ChooseSplits(
                              other, tiles, slots, max_splits, max_waves)));
  }
  std::printf("constants %lld %lld\n",
              static_cast<long long>(keras_ecoc::cuda::launch_shape::kBlockCostTiles),
              static_cast<long long>(keras_ecoc::cuda::launch_shape::kMaxSplitWaves));
  return 0;
}
"""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def reference_splits(other: int, tiles: int, slots: int, max_splits: int, max_waves: int) -> int:
    if other <= 0 or tiles <= 1 or slots <= 0 or max_splits <= 1:
        return 1
    cap = max(max_waves, _ceil(other, slots))
    best, best_cost = None, None
    for s in range(1, min(tiles, max_splits) + 1):
        waves = _ceil(other * s, slots)
        if s > 1 and waves > cap:
            continue
        cost = waves * (_ceil(tiles, s) + BLOCK_COST_TILES)
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


@pytest.fixture(scope="module")
def choose_splits(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    work = tmp_path_factory.mktemp("launch_shape")
    (work / "main.cc").write_text(_MAIN)
    exe = work / "choose_splits"
    subprocess.run([cxx, "-std=c++17", "-O1", "-I", str(HEADER.parent), str(work / "main.cc"),
                    "-o", str(exe)], check=True, capture_output=True, text=True)

    def run(queries):
        text = "".join(" ".join(map(str, q)) + "\n" for q in queries)
        out = subprocess.run([str(exe)], input=text, capture_output=True, text=True,
                             check=True).stdout.split("\n")
        assert out[len(queries)] == f"constants {BLOCK_COST_TILES} {MAX_SPLIT_WAVES}", \
            "the header's constants changed: update this test's copies"
        return [int(v) for v in out[:len(queries)]]

    return run


def test_split_rule_matches_a_brute_force_of_its_definition(choose_splits):
    others = [1, 2, 3, 4, 7, 16, 17, 64, 65, 132, 200, 256, 263, 264, 265, 396, 1000, 31250]
    tiles = [0, 1, 2, 3, 5, 16, 17, 64, 157, 313, 1000, 1563, 15625, 31250]
    slots = [1, 2, 3, 132, 264, 396, 528, 1056]
    queries = [(o, t, sl, MAX_SPLITS, w)
               for o, t, sl, w in itertools.product(others, tiles, slots, (1, MAX_SPLIT_WAVES))]
    got = choose_splits(queries)
    wrong = [(q, g, reference_splits(*q)) for q, g in zip(queries, got)
             if g != reference_splits(*q)]
    assert not wrong, f"(other, tiles, slots, max, waves), got, want: {wrong[:10]}"
    assert len(queries) > 4000


def test_split_rule_on_the_h100_grids_the_kernel_readme_names(choose_splits):
    # H100: 132 SMs; blocks per SM from the Nsight Compute block limits
    # (docs/device_runs/2026-11-26-h100-variants/run1_ncu_forward.log).
    cells = {
        # B = 16, n = 1e6, register softmax (64-class tiles), 3 blocks per
        # SM: one full wave of 391 splits (40 tiles each; 396 would give
        # the same longest split).
        (1, 15625, 396, MAX_SPLITS, MAX_SPLIT_WAVES): 391,
        # B = 256 with 64-row tiles (4 row tiles), 2 blocks per SM: 66.
        (4, 15625, 264, MAX_SPLITS, MAX_SPLIT_WAVES): 66,
        # B = 4096, TF32, 64-row tiles (64 row tiles), 2 per SM: one wave
        # of 256 blocks rather than 320 (the old rule's 5 splits).
        (64, 15625, 264, MAX_SPLITS, MAX_SPLIT_WAVES): 4,
        # B = 4096, 3xTF32, 16-row tiles (256 row tiles), 3 per SM: two
        # full waves of 768 blocks (cost 2 x 5,210) beat one wave of 256
        # (the old rule's 2 splits: 512 blocks, also 2 waves, cost 2 x 7,814).
        (256, 15625, 396, MAX_SPLITS, MAX_SPLIT_WAVES): 3,
        # Codes gradient, n = 1e4 (313 class tiles), B = 1024 (64 batch
        # tiles): one wave at most, so 3 splits of 22 tiles.
        (313, 64, 1056, MAX_SPLITS, 1): 3,
        # More rows than slots: splitting would only add waves.
        (2 ** 36, 2 ** 35, 396, MAX_SPLITS, MAX_SPLIT_WAVES): 1,
    }
    got = choose_splits(list(cells))
    assert dict(zip(cells, got)) == cells


def test_split_rule_never_adds_waves_past_the_cap_and_never_splits_one_tile(choose_splits):
    queries = [(o, t, sl, MAX_SPLITS, w) for o in (1, 5, 50, 500) for t in (1, 9, 900)
               for sl in (7, 132, 396) for w in (1, 2, MAX_SPLIT_WAVES)]
    for (o, t, sl, _, w), s in zip(queries, choose_splits(queries)):
        assert 1 <= s <= max(1, min(t, MAX_SPLITS))
        if s > 1:
            assert _ceil(o * s, sl) <= max(w, _ceil(o, sl)), (o, t, sl, w, s)
        if t <= 1:
            assert s == 1
