// The device code of gnsilu-micro (tools/micro/main.cpp), compiled at run time by NVRTC like the library's kernels:
// the latencies and bandwidths issue 26's read-once design rests on. Every kernel is extern "C" (its name is its
// symbol). The cluster and bulk-copy kernels need sm_90; below it they compile to nothing and are not launched.
#pragma once

namespace gnsilu::micro {

inline constexpr const char* kKernelNames[] = {
    "micro_grid_barrier", "micro_flag", "micro_cluster_barrier", "micro_dsmem_reduce", "micro_load_vector",
    "micro_load_bulk", "micro_read_once"};

inline constexpr const char* kKernelSource = R"MICRO(
typedef unsigned long long u64;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// A barrier of every block of the grid (all co-resident: the host launches at most what fits at once). state[0]
// counts arrivals, state[1] is the generation; both start at 0.
__device__ void grid_sync(unsigned* state, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned generation = ld_acquire(state + 1);
    if (atomicAdd(state, 1u) == blocks - 1) {
      state[0] = 0;
      st_release(state + 1, generation + 1);  // orders the reset before the release
    } else {
      while (ld_acquire(state + 1) == generation) {
      }
    }
  }
  __syncthreads();
}

extern "C" __global__ void micro_grid_barrier(unsigned* state, unsigned rounds) {
  for (unsigned r = 0; r < rounds; ++r) grid_sync(state, gridDim.x);
}

// A flag passed from block 0 to the grid's last block and back `rounds` times (flags[0] and flags[1] start at 0):
// the time of a round is two one-way flag latencies between two SMs.
extern "C" __global__ void micro_flag(unsigned* flags, unsigned rounds) {
  if (threadIdx.x != 0) return;
  const bool first = blockIdx.x == 0, last = blockIdx.x == gridDim.x - 1;
  for (unsigned r = 1; r <= rounds; ++r) {
    if (first) {
      st_release(flags, r);
      while (ld_acquire(flags + 1) != r) {
      }
    } else if (last) {
      while (ld_acquire(flags) != r) {
      }
      st_release(flags + 1, r);
    }
  }
}

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ unsigned cluster_blocks() {
  unsigned n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

// The word at `local` (this block's shared memory) in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ u64 load_remote(const u64* local, unsigned rank) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
  u64 v;
  asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(remote) : "memory");
  return v;
}

// Waits until the mbarrier at shared address `barrier` has completed the phase of parity `phase`.
__device__ __forceinline__ void wait_parity(unsigned barrier, unsigned phase) {
  unsigned done = 0;
  while (!done) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(barrier), "r"(phase)
        : "memory");
  }
}
#endif

// `rounds` cluster barriers (launched with a cluster dimension).
extern "C" __global__ void micro_cluster_barrier(unsigned rounds, unsigned* out) {
#if __CUDA_ARCH__ >= 900
  for (unsigned r = 0; r < rounds; ++r) cluster_sync();
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = rounds;
#endif
}

// `rounds` times: every block of a cluster writes a 32-word record (the size of a group's exact statistics) into
// its shared memory, and the cluster's block 0 sums the records of all of them through distributed shared memory;
// two cluster barriers a round (records written; records read).
extern "C" __global__ void micro_dsmem_reduce(unsigned rounds, u64* out) {
#if __CUDA_ARCH__ >= 900
  __shared__ u64 record[32];
  const unsigned rank = cluster_rank(), blocks = cluster_blocks();
  u64 total = 0;
  for (unsigned r = 0; r < rounds; ++r) {
    if (threadIdx.x < 32) record[threadIdx.x] = static_cast<u64>(r + rank + threadIdx.x);
    cluster_sync();
    if (rank == 0 && threadIdx.x < 32) {
      for (unsigned q = 0; q < blocks; ++q) total += load_remote(&record[threadIdx.x], q);
    }
    cluster_sync();
  }
  if (rank == 0 && threadIdx.x < 32) out[blockIdx.x * 32 + threadIdx.x] = total;
#endif
}

// Slices of `slice16` 16-byte words of x, block after block over the whole buffer, loaded into shared memory with
// plain vector loads by every thread, then read back (one word in four summed, so that nothing is optimized away).
extern "C" __global__ void micro_load_vector(const uint4* x, u64 n16, unsigned slice16, unsigned* out) {
  extern __shared__ uint4 tile[];
  unsigned sum = 0;
  for (u64 base = static_cast<u64>(blockIdx.x) * slice16; base < n16; base += static_cast<u64>(gridDim.x) * slice16) {
    const unsigned count = static_cast<unsigned>(n16 - base < slice16 ? n16 - base : slice16);
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x) tile[i] = x[base + i];
    __syncthreads();
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x) sum += tile[i].x;
    __syncthreads();
  }
  if (sum == 0x9e3779b9u) out[0] = sum;
}

// The same slices loaded by one bulk copy each (cp.async.bulk, completion counted on an mbarrier), then read back
// alike.
extern "C" __global__ void micro_load_bulk(const uint4* x, u64 n16, unsigned slice16, unsigned* out) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ uint4 tile[];
  __shared__ __align__(8) u64 barrier;
  const unsigned barrier_address = static_cast<unsigned>(__cvta_generic_to_shared(&barrier));
  const unsigned tile_address = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(barrier_address) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  unsigned phase = 0, sum = 0;
  for (u64 base = static_cast<u64>(blockIdx.x) * slice16; base < n16; base += static_cast<u64>(gridDim.x) * slice16) {
    const unsigned count = static_cast<unsigned>(n16 - base < slice16 ? n16 - base : slice16);
    if (threadIdx.x == 0) {
      const unsigned bytes = count * 16u;
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the reads of the last slice come first
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier_address), "r"(bytes)
                   : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       tile_address),
                   "l"(x + base), "r"(bytes), "r"(barrier_address)
                   : "memory");
    }
    wait_parity(barrier_address, phase);
    phase ^= 1u;
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x) sum += tile[i].x;
    __syncthreads();
  }
  if (sum == 0x9e3779b9u) out[0] = sum;
#endif
}

// ---- a prototype of issue 26's read-once kernel: one cluster per group, the group held in shared memory ----------
// NCHW BF16, y = silu((x - mean) / sqrt(var + eps)) (no weight or bias), groups of group_elems contiguous elements.
// Each block of a cluster of K loads its slice (group_elems / K elements) into shared memory with kPieces bulk
// copies, sums x and x^2 over it as FP32 per thread and FP64 per block (NOT gnsilu's exact statistics: a measure of
// the memory schedule only), exchanges the block sums through distributed shared memory, and writes y from shared
// memory with 16-byte stores. x is read from DRAM once.
#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ double load_remote_f64(const double* local, unsigned rank) {
  return __longlong_as_double(static_cast<long long>(load_remote(reinterpret_cast<const u64*>(local), rank)));
}

__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float silu_norm(float v, float mean, float rstd) {
  const float t = (v - mean) * rstd;
  return __fdividef(t, 1.0f + __expf(-t));
}

__device__ __forceinline__ unsigned apply2(unsigned w, float mean, float rstd) {
  return pack_bf16x2(silu_norm(__uint_as_float(w << 16), mean, rstd),
                     silu_norm(__uint_as_float(w & 0xffff0000u), mean, rstd));
}

__device__ __forceinline__ uint4 apply8(uint4 v, float mean, float rstd) {
  return make_uint4(apply2(v.x, mean, rstd), apply2(v.y, mean, rstd), apply2(v.z, mean, rstd), apply2(v.w, mean, rstd));
}
#endif

// bulk_store 0: y written with 16-byte stores by every thread; 1: each piece transformed in place in shared memory,
// then written by one bulk copy (cp.async.bulk, shared to global) while the next piece is transformed.
extern "C" __global__ void micro_read_once(const uint4* x, uint4* y, u64 group_elems, float eps, unsigned bulk_store) {
#if __CUDA_ARCH__ >= 900
  constexpr unsigned kPieces = 8;
  extern __shared__ uint4 tile[];
  __shared__ __align__(8) u64 barriers[kPieces];
  __shared__ float warp_sums[32][2];
  __shared__ double block_sums[2];
  __shared__ float constants[2];
  const unsigned rank = cluster_rank(), blocks = cluster_blocks();
  const u64 group = blockIdx.x / blocks;
  const u64 slice16 = group_elems / 8 / blocks;  // 16-byte words of this block's slice
  const u64 first16 = group * (group_elems / 8) + rank * slice16;
  const unsigned piece16 = static_cast<unsigned>(slice16 / kPieces);
  if (threadIdx.x == 0) {
    for (unsigned i = 0; i < kPieces; ++i) {
      const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(&barriers[i]));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (unsigned i = 0; i < kPieces; ++i) {
      const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(&barriers[i]));
      const unsigned t = static_cast<unsigned>(__cvta_generic_to_shared(tile + i * piece16));
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(piece16 * 16u) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(t),
                   "l"(x + first16 + i * piece16), "r"(piece16 * 16u), "r"(b)
                   : "memory");
    }
  }
  __syncthreads();  // the barriers are initialized before anyone waits on them
  float s1 = 0.0f, s2 = 0.0f;
  for (unsigned i = 0; i < kPieces; ++i) {
    wait_parity(static_cast<unsigned>(__cvta_generic_to_shared(&barriers[i])), 0);
    for (unsigned j = threadIdx.x; j < piece16; j += blockDim.x) {
      const uint4 v = tile[i * piece16 + j];
      const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float lo = __uint_as_float(w[k] << 16), hi = __uint_as_float(w[k] & 0xffff0000u);
        s1 += lo + hi;
        s2 = fmaf(lo, lo, fmaf(hi, hi, s2));
      }
    }
  }
  for (int h = 16; h > 0; h >>= 1) {
    s1 += __shfl_xor_sync(0xffffffffu, s1, h);
    s2 += __shfl_xor_sync(0xffffffffu, s2, h);
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (lane == 0) {
    warp_sums[warp][0] = s1;
    warp_sums[warp][1] = s2;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double a = 0, q = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) {
      a += warp_sums[w][0];
      q += warp_sums[w][1];
    }
    block_sums[0] = a;
    block_sums[1] = q;
  }
  cluster_sync();  // every block's sums are written
  if (threadIdx.x == 0) {
    double a = 0, q = 0;
    for (unsigned r = 0; r < blocks; ++r) {
      a += load_remote_f64(&block_sums[0], r);
      q += load_remote_f64(&block_sums[1], r);
    }
    const double mean = a / static_cast<double>(group_elems);
    const double var = q / static_cast<double>(group_elems) - mean * mean;
    constants[0] = static_cast<float>(mean);
    constants[1] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  }
  // This block has read the others' sums: it arrives now and waits only before it leaves, so that no block's shared
  // memory goes while another may still read it.
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  __syncthreads();
  const float mean = constants[0], rstd = constants[1];
  if (bulk_store) {
    for (unsigned i = 0; i < kPieces; ++i) {
      for (unsigned j = i * piece16 + threadIdx.x; j < (i + 1) * piece16; j += blockDim.x) {
        tile[j] = apply8(tile[j], mean, rstd);
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // this thread's writes, seen by the bulk copy
      __syncthreads();
      if (threadIdx.x == 0) {
        const unsigned t = static_cast<unsigned>(__cvta_generic_to_shared(tile + i * piece16));
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(y + first16 + i * piece16),
                     "r"(t), "r"(piece16 * 16u)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      }
    }
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // shared memory read out
    __syncthreads();
  } else {
    for (u64 j = threadIdx.x; j < slice16; j += blockDim.x) {
      y[first16 + j] = apply8(tile[j], mean, rstd);
    }
  }
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
)MICRO";

}  // namespace gnsilu::micro
