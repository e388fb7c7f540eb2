// float16 of the CUDA emulator: the storage type and the conversions the
// kernels and the harness use, rounded to nearest even as on the GPU
// (_Float16 conversions of g++ are correctly rounded, subnormals included).
#ifndef KERAS_ECOC_EMU_CUDA_FP16_H_
#define KERAS_ECOC_EMU_CUDA_FP16_H_

#include <cstdint>
#include <cstring>

struct __half_raw {
  unsigned short x;
};

struct __half {
  unsigned short __x;
  __half() = default;
  __half(__half_raw r) : __x(r.x) {}
  __half(float f) {
    const _Float16 h = static_cast<_Float16>(f);
    std::memcpy(&__x, &h, 2);
  }
  operator float() const {
    _Float16 h;
    std::memcpy(&h, &__x, 2);
    return static_cast<float>(h);
  }
  operator __half_raw() const { return __half_raw{__x}; }
};
static_assert(sizeof(__half) == 2, "__half must be 2 bytes");

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short v) { return __half(__half_raw{v}); }

#endif  // KERAS_ECOC_EMU_CUDA_FP16_H_
