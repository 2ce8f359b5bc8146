// Row-wise softmax, one block per row (blockDim = 128): max-reduction, exp, sum-reduction, scale.
#define THREADS 128

template <bool FAST>
__device__ void softmax_row(const float* in, float* out, int cols)
{
    __shared__ float red[THREADS];
    int tid = threadIdx.x;
    const float* x = in + (size_t)blockIdx.x * cols;
    float* y = out + (size_t)blockIdx.x * cols;

    float m = -__int_as_float(0x7f800000);
    for (int c = tid; c < cols; c += THREADS) m = fmaxf(m, x[c]);
    red[tid] = m;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] = fmaxf(red[tid], red[tid + s]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();

    float sum = 0.0f;
    for (int c = tid; c < cols; c += THREADS) {
        float e = FAST ? __expf(x[c] - m) : expf(x[c] - m);
        y[c] = e;
        sum += e;
    }
    red[tid] = sum;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        __syncthreads();
    }
    float total = red[0];
    for (int c = tid; c < cols; c += THREADS) y[c] = y[c] / total;
}

extern "C" __global__ void softmax_rows(const float* in, float* out, int cols)
{
    softmax_row<false>(in, out, cols);
}

extern "C" __global__ void softmax_rows_fast(const float* in, float* out, int cols)
{
    softmax_row<true>(in, out, cols);
}
