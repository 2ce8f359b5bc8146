// Texture and surface references (CUDA 11's texture<> and surface<> templates)
// through NVIDIA's CUDA 11.8 runtime: cudaBindTextureToArray with point and
// linear filtering, cudaBindTexture to linear memory (an unaligned pointer's
// offset), cudaBindTexture2D to pitched memory, normalized 8-bit texels,
// rebinding between launches, cudaBindSurfaceToArray with surf2Dread and
// surf2Dwrite, and the runtime's reference queries. CUDA 12 removed these
// from the runtime, so this program is built for CUDA 11.8's runtime only.
#include "check.h"

#include <vector>

constexpr int W = 16, H = 4;

texture<float, 2, cudaReadModeElementType> tex_array;
texture<int, 1, cudaReadModeElementType> tex_linear;
texture<float, 2, cudaReadModeElementType> tex_pitched;
texture<uchar4, 1, cudaReadModeNormalizedFloat> tex_rgba;
surface<void, 2> surf;

__global__ void read_array(float *out, float dx)
{
    int x = threadIdx.x, y = blockIdx.x;
    out[y * blockDim.x + x] = tex2D(tex_array, x + dx, y + 0.5f);
}

__global__ void read_linear(int *out, int first)
{
    out[threadIdx.x] = tex1Dfetch(tex_linear, first + (int)threadIdx.x);
}

__global__ void read_pitched(float *out)
{
    int x = threadIdx.x, y = blockIdx.x;
    out[y * blockDim.x + x] = tex2D(tex_pitched, x + 0.5f, y + 0.5f);
}

__global__ void read_rgba(float4 *out)
{
    out[threadIdx.x] = tex1D(tex_rgba, threadIdx.x + 0.5f);
}

__global__ void negate_surface()
{
    int x = threadIdx.x, y = blockIdx.x;
    float v;
    surf2Dread(&v, surf, x * (int)sizeof(float), y);
    surf2Dwrite(-v, surf, x * (int)sizeof(float), y);
}

static float value_at(int x, int y) { return float(y * 100 + x); }

int main()
{
    g_program = "texrefs";
    std::vector<float> host(W * H);
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) host[y * W + x] = value_at(x, y);
    cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
    float *dout = nullptr;
    CUDA_OK(cudaMalloc(&dout, W * H * sizeof(float)));
    std::vector<float> out(W * H);

    // ---- an array, point then linear filtering --------------------------------
    cudaArray_t arr = nullptr;
    CUDA_OK(cudaMallocArray(&arr, &fdesc, W, H));
    CUDA_OK(cudaMemcpy2DToArray(arr, 0, 0, host.data(), W * sizeof(float), W * sizeof(float), H,
                                cudaMemcpyHostToDevice));
    CUDA_OK(cudaBindTextureToArray(tex_array, arr, fdesc));
    read_array<<<H, W>>>(dout, 0.5f);
    CUDA_OK(cudaMemcpy(out.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK("tex2D through a reference bound to an array", out == host, "out[17] %g", out[17]);
    tex_array.filterMode = cudaFilterModeLinear;
    CUDA_OK(cudaBindTextureToArray(tex_array, arr, fdesc));
    read_array<<<H, W>>>(dout, 1.0f);
    CUDA_OK(cudaMemcpy(out.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    {
        bool ok = true;
        for (int y = 0; y < H; ++y)
            for (int x = 0; x + 1 < W; ++x)
                ok &= fabsf(out[y * W + x] - (value_at(x, y) + value_at(x + 1, y)) / 2) < 1e-3f;
        CHECK("linear filtering after the reference's filter mode changed", ok, "out[0] %g", out[0]);
    }
    {
        const textureReference *ref = nullptr;
        CUDA_OK(cudaGetTextureReference(&ref, &tex_array));
        cudaChannelFormatDesc d;
        CUDA_OK(cudaGetChannelDesc(&d, arr));
        size_t offset = 1;
        cudaError_t e = cudaGetTextureAlignmentOffset(&offset, &tex_array);
        CHECK("the runtime finds the reference, bound to an array, not a pointer",
              ref != nullptr && e == cudaErrorInvalidTextureBinding, "%s", cudaGetErrorName(e));
        cudaGetLastError();
    }

    // ---- linear memory, from an unaligned pointer -------------------------------
    {
        constexpr int N = 64;
        int vals[N];
        for (int i = 0; i < N; ++i) vals[i] = 3 * i - 5;
        int *dv = nullptr, *dres = nullptr;
        CUDA_OK(cudaMalloc(&dv, sizeof vals));
        CUDA_OK(cudaMalloc(&dres, sizeof vals));
        CUDA_OK(cudaMemcpy(dv, vals, sizeof vals, cudaMemcpyHostToDevice));
        size_t offset = 0;
        CUDA_OK(cudaBindTexture(&offset, tex_linear, dv, sizeof vals));
        read_linear<<<1, N>>>(dres, 0);
        int got[N];
        CUDA_OK(cudaMemcpy(got, dres, sizeof got, cudaMemcpyDeviceToHost));
        bool same = offset == 0;
        for (int i = 0; i < N; ++i) same &= got[i] == vals[i];
        CHECK("tex1Dfetch through a reference bound to linear memory", same, "offset %zu got[3] %d", offset,
              got[3]);
        // Eight ints past the start: not at the texture alignment, so the runtime hands back an
        // offset (in bytes) that fetches add.
        CUDA_OK(cudaBindTexture(&offset, tex_linear, dv + 8, sizeof vals - 8 * sizeof(int)));
        read_linear<<<1, N - 8>>>(dres, (int)(offset / sizeof(int)));
        CUDA_OK(cudaMemcpy(got, dres, (N - 8) * sizeof(int), cudaMemcpyDeviceToHost));
        same = offset == 8 * sizeof(int);
        for (int i = 0; i < N - 8; ++i) same &= got[i] == vals[i + 8];
        CHECK("an unaligned binding's offset reaches the right elements", same, "offset %zu got[0] %d",
              offset, got[0]);
        size_t asked = 0;
        CUDA_OK(cudaGetTextureAlignmentOffset(&asked, &tex_linear));
        CHECK("cudaGetTextureAlignmentOffset reports the binding's offset", asked == offset, "%zu", asked);
        // Rebound to other memory: the next launch reads it.
        int other[N];
        for (int i = 0; i < N; ++i) other[i] = -i;
        CUDA_OK(cudaMemcpy(dres, other, sizeof other, cudaMemcpyHostToDevice));
        CUDA_OK(cudaBindTexture(&offset, tex_linear, dres, sizeof other));
        read_linear<<<1, N>>>(dv, 0);
        CUDA_OK(cudaMemcpy(got, dv, sizeof got, cudaMemcpyDeviceToHost));
        same = true;
        for (int i = 0; i < N; ++i) same &= got[i] == other[i];
        CHECK("a rebound reference reads its new memory", same, "got[5] %d", got[5]);
        CUDA_OK(cudaUnbindTexture(tex_linear));
        CUDA_OK(cudaFree(dv));
        CUDA_OK(cudaFree(dres));
    }

    // ---- pitched memory ---------------------------------------------------------
    {
        float *pm = nullptr;
        size_t pitch = 0;
        CUDA_OK(cudaMallocPitch(&pm, &pitch, W * sizeof(float), H));
        CUDA_OK(cudaMemcpy2D(pm, pitch, host.data(), W * sizeof(float), W * sizeof(float), H,
                             cudaMemcpyHostToDevice));
        size_t offset = 1;
        CUDA_OK(cudaBindTexture2D(&offset, tex_pitched, pm, fdesc, W, H, pitch));
        read_pitched<<<H, W>>>(dout);
        CUDA_OK(cudaMemcpy(out.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("tex2D through a reference bound to pitched memory", out == host && offset == 0,
              "out[20] %g offset %zu", out[20], offset);
        CUDA_OK(cudaUnbindTexture(tex_pitched));
        CUDA_OK(cudaFree(pm));
    }

    // ---- 8-bit texels read as normalized floats ---------------------------------
    {
        constexpr int N = 4;
        uchar4 px[N] = {{0, 51, 102, 255}, {255, 0, 1, 2}, {10, 20, 30, 40}, {128, 64, 32, 16}};
        cudaChannelFormatDesc cd = cudaCreateChannelDesc<uchar4>();
        cudaArray_t a = nullptr;
        CUDA_OK(cudaMallocArray(&a, &cd, N, 0));
        CUDA_OK(cudaMemcpy2DToArray(a, 0, 0, px, sizeof px, sizeof px, 1, cudaMemcpyHostToDevice));
        CUDA_OK(cudaBindTextureToArray(tex_rgba, a, cd));
        float4 *df = nullptr;
        CUDA_OK(cudaMalloc(&df, N * sizeof(float4)));
        read_rgba<<<1, N>>>(df);
        float4 f[N];
        CUDA_OK(cudaMemcpy(f, df, sizeof f, cudaMemcpyDeviceToHost));
        bool ok = true;
        for (int i = 0; i < N; ++i)
            ok &= fabsf(f[i].x - px[i].x / 255.0f) < 1e-6f && fabsf(f[i].w - px[i].w / 255.0f) < 1e-6f;
        CHECK("normalized-float reads through a reference", ok, "%g %g", f[1].x, f[0].w);
        CUDA_OK(cudaUnbindTexture(tex_rgba));
        CUDA_OK(cudaFreeArray(a));
        CUDA_OK(cudaFree(df));
    }

    // ---- a surface reference ----------------------------------------------------
    {
        cudaArray_t a = nullptr;
        CUDA_OK(cudaMallocArray(&a, &fdesc, W, H, cudaArraySurfaceLoadStore));
        CUDA_OK(cudaMemcpy2DToArray(a, 0, 0, host.data(), W * sizeof(float), W * sizeof(float), H,
                                    cudaMemcpyHostToDevice));
        CUDA_OK(cudaBindSurfaceToArray(surf, a));
        negate_surface<<<H, W>>>();
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> back(W * H);
        CUDA_OK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), a, 0, 0, W * sizeof(float), H,
                                      cudaMemcpyDeviceToHost));
        bool ok = true;
        for (int i = 0; i < W * H; ++i) ok &= back[i] == -host[i];
        CHECK("surf2Dread and surf2Dwrite through a surface reference", ok, "back[5] %g", back[5]);
        CUDA_OK(cudaFreeArray(a));
    }

    CUDA_OK(cudaUnbindTexture(tex_array));
    CUDA_OK(cudaFreeArray(arr));
    CUDA_OK(cudaFree(dout));
    CUDA_OK(cudaDeviceSynchronize());
    return finish();
}
