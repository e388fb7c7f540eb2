// How many splits a split kernel's grid gets: host-only, no CUDA types, so
// that the launchers (ecoc_kernels.cu.cc) and a test compiled by g++ alone
// (tests/test_cuda_launch_shape.py, against a brute force in Python) use the
// same function.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_LAUNCH_SHAPE_H_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_LAUNCH_SHAPE_H_

#include <algorithm>
#include <cstdint>

namespace keras_ecoc {
namespace cuda {
namespace launch_shape {

// A block's fixed cost in tiles (staging its u rows and first code tile,
// writing its partial state): a modelling constant, not a measurement. It
// only decides near-ties, towards fewer and longer splits.
constexpr int64_t kBlockCostTiles = 1;

// Waves the forward and decode passes may add by splitting: bounds their
// partial states (4·B·S·(k + 2) bytes) at a few times what one wave needs.
constexpr int64_t kMaxSplitWaves = 4;

// Splits of a split kernel's `tiles` (class tiles in the forward, rank and
// nearest passes; batch tiles in the codes gradient) over a grid with
// `other` blocks per split (its x dimension), on a device that keeps
// `slots` blocks of that kernel resident at once (SMs x blocks per SM, from
// the occupancy calculator).
//
// The blocks of a launch do equal work and are latency-bound (Nsight
// Compute on the H100: 8-12 warps per SM, about 4 cycles between a warp's
// instructions), so a launch takes about
//   waves x (tiles of its longest split + kBlockCostTiles),
//   waves = ceil(other x splits / slots):
// a grid one block past a whole wave waits a whole split longer, and 2 full
// waves of short splits beat 1 wave two-thirds full (B = 4096 at 3 blocks
// per SM on an H100: 256 row tiles, 396 slots). The rule takes the splits
// of least cost, the fewest on a tie (fewer partial states to combine),
// among 1 .. min(tiles, max_splits) with at most `max_waves` waves, or as
// many as one split already needs. flash-attention's num_splits_heuristic
// (csrc/flash_attn/flash_api.cpp) weighs wave efficiency the same way.
inline int64_t ChooseSplits(int64_t other, int64_t tiles, int64_t slots, int64_t max_splits,
                            int64_t max_waves) {
  if (other <= 0 || tiles <= 1 || slots <= 0 || max_splits <= 1) return 1;
  const auto cost = [&](int64_t s, int64_t waves) {
    // double: waves x tiles can pass 2^63 at the contract's largest shapes.
    return static_cast<double>(waves) * static_cast<double>((tiles + s - 1) / s + kBlockCostTiles);
  };
  const int64_t wave_cap = std::max(max_waves, (other + slots - 1) / slots);
  int64_t best = 1;
  double best_cost = cost(1, (other + slots - 1) / slots);
  for (int64_t s = 2; s <= std::min(tiles, max_splits); ++s) {
    const int64_t waves = (other * s + slots - 1) / slots;
    if (waves > wave_cap) break;
    const double c = cost(s, waves);
    if (c < best_cost) {
      best = s;
      best_cost = c;
    }
  }
  return best;
}

}  // namespace launch_shape
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_LAUNCH_SHAPE_H_
