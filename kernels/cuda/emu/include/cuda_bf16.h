// bfloat16 of the CUDA emulator: the storage type and the conversions the
// kernels and the harness use, float -> bfloat16 rounded to nearest even
// (NaN stays a quiet NaN), as __float2bfloat16 does on the GPU.
#ifndef KERAS_ECOC_EMU_CUDA_BF16_H_
#define KERAS_ECOC_EMU_CUDA_BF16_H_

#include <cstdint>
#include <cstring>

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
  __nv_bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      __x = static_cast<unsigned short>((u >> 16) | 0x40u);  // quiet NaN, sign kept
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      __x = static_cast<unsigned short>(u >> 16);
    }
  }
  operator float() const {
    const uint32_t u = static_cast<uint32_t>(__x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
static_assert(sizeof(__nv_bfloat16) == 2, "__nv_bfloat16 must be 2 bytes");
typedef __nv_bfloat16 nv_bfloat16;

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) {
  return __nv_bfloat16(__nv_bfloat16_raw{v});
}

#endif  // KERAS_ECOC_EMU_CUDA_BF16_H_
