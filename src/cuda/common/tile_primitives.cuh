// Warp-level tile primitives of the mma.sync generation (sm80..sm90), written over PTX:
// tensor-core products (m16n8k16 for fp16/bf16, m16n8k8 tf32 for fp32; fp32 accumulators),
// ldmatrix fragment loads from shared memory, and cp.async global->shared copies with
// commit/wait groups. The dtype-generic operand layer the sm80 mainloops are written against
// (fragments, k-steps of 32 bytes, the fp32 "3xTF32" split) is tile_operands.cuh.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with g = lane / 4, c = lane % 4:
//   A 16x16 (row-major): a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g, 2c+8..), a3 = (g+8, 2c+8..)
//   B 16x8  (k x n):     b0 = (k 2c..2c+1, n g), b1 = (k 2c+8.., n g)
//   C 16x8  (fp32):      c0,c1 = (g, 2c..2c+1), c2,c3 = (g+8, 2c..2c+1)
// Each 32-bit register holds two 16-bit values, the lower column in the low half.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fmha::cuda::tile {

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Per-dtype storage and conversions. Storage is the element as it sits in global and shared
// memory (16-bit payloads as raw bits).
template <typename T>
struct Dtype;

template <>
struct Dtype<__half> {
  using Storage = std::uint16_t;
  __device__ __forceinline__ static float to_float(std::uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
  }
  __device__ __forceinline__ static std::uint16_t from_float(float x) {
    return __half_as_ushort(__float2half_rn(x));
  }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
  // The inverse of pack (exact): low half in x.
  __device__ __forceinline__ static float2 unpack(std::uint32_t word) {
    return __half22float2(*reinterpret_cast<const __half2*>(&word));
  }
};

template <>
struct Dtype<__nv_bfloat16> {
  using Storage = std::uint16_t;
  __device__ __forceinline__ static float to_float(std::uint16_t bits) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  }
  __device__ __forceinline__ static std::uint16_t from_float(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
  // The inverse of pack (exact: a bf16 is the top half of its fp32): low half in x.
  __device__ __forceinline__ static float2 unpack(std::uint32_t word) {
    return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
  }
};

template <>
struct Dtype<float> {
  using Storage = float;
  __device__ __forceinline__ static float to_float(float x) { return x; }
  __device__ __forceinline__ static float from_float(float x) { return x; }
};

// d += a * b on a 16x8x16 tile; fp32 accumulators, fp16 or bf16 operands.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4],
                                             std::uint32_t b0, std::uint32_t b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const std::uint32_t (&a)[4],
                                                     std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4],
                                                            const std::uint32_t (&a)[4],
                                                            std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a * b on a 16x8x8 tile with tf32 operands (the low 13 mantissa bits of each 32-bit operand
// register are ignored by the tensor cores) and fp32 accumulators. Fragment layouts (PTX ISA,
// "Matrix fragments for mma.m16n8k8", .tf32), g = lane / 4, c = lane % 4:
//   A 16x8: a0 = (g, c), a1 = (g+8, c), a2 = (g, c+4), a3 = (g+8, c+4)
//   B 8x8 (k x n): b0 = (k c, n g), b1 = (k c+4, n g);  C as for m16n8k16.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const std::uint32_t (&a)[4],
                                                 std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One 32-bit shared-memory load (operands that no ldmatrix shape delivers: fp32 transposed).
__device__ __forceinline__ std::uint32_t ld_shared_b32(std::uint32_t address) {
  std::uint32_t r;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(r) : "r"(address));
  return r;
}

// Four 8x8 16-bit matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// As ldmatrix_x4, each matrix transposed: gives B fragments of a k-major (row = k) tile.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// 16-byte asynchronous copy global -> shared, bypassing L1. With src_bytes == 0 nothing is read
// and the 16 bytes are zero-filled (used for rows and columns past the tensor's end).
__device__ __forceinline__ void cp_async_16(std::uint32_t shared_dst, const void* global_src,
                                            int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_dst), "l"(global_src),
               "r"(src_bytes));
}

// cp_async_16 whose miss in L2 fetches the whole 128-byte line from memory (the .L2::128B prefetch
// hint), for streams that read every byte of their lines: the KV-cache decode kernel's copies of
// K and V rows read 2% faster with it (H200, 2026-11-29: D 128 B 8 L 128k 1.036 -> 1.013 ms,
// D 256 B 8 L 32k 0.530 -> 0.519; the .L2::256B hint did nothing).
__device__ __forceinline__ void cp_async_16_whole_lines(std::uint32_t shared_dst,
                                                        const void* global_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(shared_dst),
               "l"(global_src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until every cp.async of this thread has landed, committed to a group or not (a thread whose
// copies an mbarrier tracks commits no groups, which cp_async_wait does not wait for).
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Waits until at most `kPending` committed groups of this thread are still in flight. The "memory"
// clobber keeps the compiler from moving reads of the landed shared memory above the wait.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace fmha::cuda::tile
