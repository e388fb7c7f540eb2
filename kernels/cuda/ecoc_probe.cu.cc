// What the CUDA part of the op library holds, and whether it can run on the
// GPU of this process: a small extern "C" interface for the Python loader
// (keras_ecoc/ops/_loader.py calls it through ctypes), compiled by nvcc with
// the same -gencode flags as ecoc_kernels.cu.cc and linked into the same .so.
//
// Why a probe at all: the kernels are registered for DEVICE_GPU, so TensorFlow
// places every non-XLA call on a visible GPU onto them.  If the card's compute
// capability is not covered by the fatbinary, if the driver is older than the
// static CUDA runtime linked here, or if the code length needs more shared
// memory than the card has, the launch fails with an InternalError.  The
// loader asks this probe first and routes such calls elsewhere.
//
// The probe never allocates device memory.  It initialises the CUDA runtime
// (and so a primary context on `device`), which TensorFlow does anyway before
// it runs anything on that GPU; the loader calls it only when TensorFlow
// lists a GPU.
#include <cuda_runtime.h>

#include <cstring>

#ifndef ECOC_CUDA_ARCHS
#error "ECOC_CUDA_ARCHS must be defined by the build (e.g. \"sm_80,compute_90\")"
#endif

namespace {

// Read from the file by the loader without loading it (see _loader.py).
// `used` keeps it even though nothing in C++ references it.
__attribute__((used)) const char kArchMarker[] =
    "KERAS_ECOC_CUDA_ARCHS=" ECOC_CUDA_ARCHS ";";

// A kernel compiled exactly like the real ones: asking the runtime for its
// attributes tells whether the fatbinary has an image this device can load
// (SASS of a compatible architecture, or PTX the driver can JIT).
__global__ void EcocProbeKernel(int* out) {
  if (out != nullptr) *out = 1;
}

}  // namespace

extern "C" {

// Comma-separated architectures this object was compiled for, e.g.
// "sm_75,sm_80,sm_86,sm_89,sm_90,compute_90".
__attribute__((visibility("default"))) const char* KerasEcocCudaArchs() {
  return ECOC_CUDA_ARCHS;
}

// CUDART_VERSION of the static runtime linked into the library (e.g. 13000).
__attribute__((visibility("default"))) int KerasEcocCudaRuntimeVersion() {
  return CUDART_VERSION;
}

// Fills what the guard needs to know about `device`.  Returns 0 on success or
// the cudaError_t of the first call that failed; error_name/error_string (may
// be null) receive cudaGetErrorName/cudaGetErrorString of that error.
//   driver_version      cudaDriverGetVersion (0 = no driver)
//   device_count        cudaGetDeviceCount
//   cc_major, cc_minor  compute capability of `device`
//   smem_optin          cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
//   image_status        cudaFuncGetAttributes on a kernel compiled like the
//                       real ones: 0 = an image loads, else the error
//                       (cudaErrorNoKernelImageForDevice, ...)
//   binary_version,     of that image (10 * major + minor; ptx 0 when SASS)
//   ptx_version
__attribute__((visibility("default"))) int KerasEcocCudaProbe(
    int device, int* driver_version, int* device_count, int* cc_major,
    int* cc_minor, int* smem_optin, int* image_status, int* binary_version,
    int* ptx_version, char* error_name, int error_name_len) {
  auto fail = [&](cudaError_t err) {
    if (error_name != nullptr && error_name_len > 0) {
      std::strncpy(error_name, cudaGetErrorName(err), error_name_len - 1);
      error_name[error_name_len - 1] = '\0';
    }
    return static_cast<int>(err);
  };
  *driver_version = 0;
  *device_count = 0;
  *cc_major = *cc_minor = *smem_optin = 0;
  *image_status = -1;
  *binary_version = *ptx_version = 0;
  cudaError_t err = cudaDriverGetVersion(driver_version);
  if (err != cudaSuccess) return fail(err);
  err = cudaGetDeviceCount(device_count);
  if (err != cudaSuccess) return fail(err);
  if (device < 0 || device >= *device_count) return fail(cudaErrorInvalidDevice);
  err = cudaDeviceGetAttribute(cc_major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return fail(err);
  err = cudaDeviceGetAttribute(cc_minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return fail(err);
  err = cudaDeviceGetAttribute(smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                               device);
  if (err != cudaSuccess) return fail(err);
  err = cudaSetDevice(device);
  if (err != cudaSuccess) return fail(err);
  cudaFuncAttributes attr;
  const cudaError_t image = cudaFuncGetAttributes(
      &attr, reinterpret_cast<const void*>(EcocProbeKernel));
  *image_status = static_cast<int>(image);
  if (image == cudaSuccess) {
    *binary_version = attr.binaryVersion;
    *ptx_version = attr.ptxVersion;
  } else {
    (void)cudaGetLastError();  // clear the sticky-free error for later calls
    fail(image);
  }
  return 0;
}

}  // extern "C"
