/*
 * gpu_kernel.cu -- the gather / scatter kernel of the CUDA backend
 * (gpu_cuda.c, copy mode "kernel"): one launch moves a whole table of
 * pieces between device memory and page-locked, device-mapped host memory
 * (the segment mapping, a staging ring), instead of one driver call per
 * piece.
 *
 * Built by `make gpu-kernel` (nvcc -ptx) into gpu_kernel_ptx.c, which is
 * committed: the library never needs nvcc, and loads the PTX with
 * cuModuleLoadData (the driver compiles it for the GPU at hand).
 *
 * Contract: t[0..n) are tiles of at most KVP_GPU_TILE bytes (the host cuts
 * pieces into tiles so that large pieces spread over many blocks); block b
 * copies tiles b, b + gridDim.x, ...; each tile's bytes are copied exactly
 * once, with 16-byte loads and stores when dst, src and len allow.
 */
struct kvp_gpu_tile {
    unsigned long long dst, src, len;
};

extern "C" __global__ void kvp_gpu_gather(const kvp_gpu_tile *t, unsigned n)
{
    for (unsigned i = blockIdx.x; i < n; i += gridDim.x) {
        kvp_gpu_tile q = t[i];
        if (((q.dst | q.src | q.len) & 15ull) == 0) {
            uint4 *d = (uint4 *)q.dst;
            const uint4 *s = (const uint4 *)q.src;
            unsigned long long m = q.len >> 4;
            for (unsigned long long k = threadIdx.x; k < m; k += blockDim.x)
                d[k] = s[k];
        } else {
            char *d = (char *)q.dst;
            const char *s = (const char *)q.src;
            for (unsigned long long k = threadIdx.x; k < q.len; k += blockDim.x)
                d[k] = s[k];
        }
    }
}
