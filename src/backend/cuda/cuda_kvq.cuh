/* cuda_kvq.cuh - one element of a KV cache row in any of the device's formats (hm_cuda_kv), for the
 * attention kernels that read them (cuda_attn.cu, cuda_flash.cu, cuda_gemma.cu): f16, bf16, or
 * ggml's q8_0 (34-byte blocks: f16 scale, 32 int8 codes) and q4_0 (18-byte blocks: f16 scale, 16
 * bytes of nibbles, element j of a block the low nibble of byte j for j < 16, the high nibble of
 * byte j - 16 after, minus 8). The values are the CPU's to_float ones, exactly (code * scale in
 * f32). Rows are row_bytes<KT>(head_dim) apart. */
#ifndef HM_CUDA_KVQ_CUH
#define HM_CUDA_KVQ_CUH

#include <cuda_fp16.h>
#include <stdint.h>

namespace hmkv {

/* KT: an hm_cuda_kv value (0 f16, 1 q8_0, 2 q4_0, 3 bf16) */
template <int KT>
__host__ __device__ constexpr int64_t row_bytes(int64_t head_dim) {
    return KT == 1 ? head_dim / 32 * 34 : KT == 2 ? head_dim / 32 * 18 : head_dim * 2;
}

template <int KT>
__device__ __forceinline__ float elem(const unsigned char *row, int e) {
    if constexpr (KT == 0) {
        return __half2float(*(const __half *)(row + 2 * e));
    } else if constexpr (KT == 3) {
        return __uint_as_float((uint32_t)*(const uint16_t *)(row + 2 * e) << 16);
    } else if constexpr (KT == 1) {
        const unsigned char *b = row + (e / 32) * 34;
        return (float)((const signed char *)b)[2 + e % 32] * __half2float(*(const __half *)b);
    } else {
        const unsigned char *b = row + (e / 32) * 18;
        const int j = e % 32;
        const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
        return (float)(q - 8) * __half2float(*(const __half *)b);
    }
}

} // namespace hmkv

#endif
