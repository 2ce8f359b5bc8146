// Read-only data-cache loads (__ldg -> ld.global.nc), scalar and vector.

extern "C" __global__ void ldg_gather(const float* __restrict__ src, const int* __restrict__ idx,
                                      float* __restrict__ out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = __ldg(&src[__ldg(&idx[i])]) * 2.0f + __ldg(&src[i & 63]);
}

// float4 loads and stores (16-byte vector accesses), components reversed.
extern "C" __global__ void ldg_vec4(const float4* __restrict__ in, float4* __restrict__ out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float4 v = __ldg(&in[i]);
    out[i] = make_float4(v.w, v.z, v.y, v.x);
}
