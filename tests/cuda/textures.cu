// CUDA arrays, texture objects and surface objects through NVIDIA's runtime:
// cudaMallocArray / cudaMalloc3DArray (2-D, 3-D, layered, surface load/store),
// cudaMemcpy2DToArray / cudaMemcpy3D / cudaMemcpy2DFromArray, texture objects
// over arrays, pitched and linear memory (point and linear filtering,
// normalized coordinates with wrap, clamp and border, normalized-float and
// element reads of 8-bit texels, tex1Dfetch, tex2Dgather, tex3D,
// tex2DLayered), cube maps (texCubemap, texCubemapLayered, surfCubemapwrite),
// surf2Dread/surf2Dwrite, the descriptors the runtime reads
// back, refusals CUDA makes, and the slice charged for an array's memory.
#include "check.h"

#include <algorithm>
#include <vector>

constexpr int W = 16, H = 8;

static float value_at(int x, int y) { return float(y * 100 + x); }

__global__ void sample_2d(cudaTextureObject_t t, float *out, float dx, float dy)
{
    int x = threadIdx.x, y = blockIdx.x;
    out[y * blockDim.x + x] = tex2D<float>(t, x + dx, y + dy);
}

__global__ void sample_at(cudaTextureObject_t t, const float2 *at, float *out)
{
    int i = threadIdx.x;
    out[i] = tex2D<float>(t, at[i].x, at[i].y);
}

__global__ void sample_1d(cudaTextureObject_t t, const float *at, float *out)
{
    int i = threadIdx.x;
    out[i] = tex1D<float>(t, at[i]);
}

__global__ void sample_rgba(cudaTextureObject_t normalized, cudaTextureObject_t raw, float4 *f, uint4 *u)
{
    int i = threadIdx.x;
    f[i] = tex1D<float4>(normalized, i + 0.5f);
    uchar4 r = tex1D<uchar4>(raw, i + 0.5f);
    u[i] = make_uint4(r.x, r.y, r.z, r.w);
}

__global__ void fetch_linear(cudaTextureObject_t t, int *out)
{
    int i = threadIdx.x;
    out[i] = tex1Dfetch<int>(t, i);
}

__global__ void sample_3d(cudaTextureObject_t t, float *out, int n)
{
    int x = threadIdx.x, y = threadIdx.y, z = threadIdx.z;
    out[(z * n + y) * n + x] = tex3D<float>(t, x + 0.5f, y + 0.5f, z + 0.5f);
}

__global__ void sample_layered(cudaTextureObject_t t, float *out, int n)
{
    int x = threadIdx.x, y = threadIdx.y, layer = blockIdx.x;
    out[(layer * n + y) * n + x] = tex2DLayered<float>(t, x + 0.5f, y + 0.5f, layer);
}

__global__ void gather(cudaTextureObject_t t, float4 *out)
{
    out[0] = tex2Dgather<float4>(t, 3.0f, 2.0f, 0);
}

// The CUDA sample simpleCubemapTexture's kernel: texel (x, y) of each face, through the
// direction that points at its centre; layer `layer` of a layered cube map when `layered`.
__global__ void cube_faces(cudaTextureObject_t t, float *out, int width, bool layered, int layer)
{
    int x = threadIdx.x, y = blockIdx.x;
    float u = ((x + 0.5f) / (float)width) * 2.f - 1.f;
    float v = ((y + 0.5f) / (float)width) * 2.f - 1.f;
    for (int face = 0; face < 6; ++face) {
        float cx, cy, cz;
        if (face == 0) { cx = 1; cy = -v; cz = -u; }
        else if (face == 1) { cx = -1; cy = -v; cz = u; }
        else if (face == 2) { cx = u; cy = 1; cz = v; }
        else if (face == 3) { cx = u; cy = -1; cz = -v; }
        else if (face == 4) { cx = u; cy = -v; cz = 1; }
        else { cx = -u; cy = -v; cz = -1; }
        out[(face * width + y) * width + x] =
            layered ? texCubemapLayered<float>(t, cx, cy, cz, layer) : texCubemap<float>(t, cx, cy, cz);
    }
}

// Writes face * 1000 + y * 10 + x into every texel of a cube map through a surface.
__global__ void cube_surface(cudaSurfaceObject_t s, int width)
{
    int x = threadIdx.x, y = blockIdx.x;
    for (int face = 0; face < 6; ++face)
        surfCubemapwrite(float(face * 1000 + y * 10 + x), s, x * (int)sizeof(float), y, face);
}

__global__ void sample_bits(cudaTextureObject_t t, unsigned *out)
{
    int x = threadIdx.x, y = blockIdx.x;
    out[y * blockDim.x + x] = tex2D<unsigned>(t, x + 0.5f, y + 0.5f);
}

__global__ void double_in_place(cudaSurfaceObject_t s)
{
    int x = threadIdx.x, y = blockIdx.x;
    float v;
    surf2Dread(&v, s, x * (int)sizeof(float), y);
    surf2Dwrite(v * 2.0f + 1.0f, s, x * (int)sizeof(float), y);
}

static cudaTextureDesc texture_desc(cudaTextureFilterMode filter, cudaTextureAddressMode address,
                                    bool normalized, cudaTextureReadMode read = cudaReadModeElementType)
{
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = address;
    td.filterMode = filter;
    td.readMode = read;
    td.normalizedCoords = normalized;
    return td;
}

static cudaTextureObject_t texture_of(const cudaResourceDesc &res, cudaTextureFilterMode filter,
                                      cudaTextureAddressMode address, bool normalized,
                                      cudaTextureReadMode read = cudaReadModeElementType)
{
    cudaTextureDesc td = texture_desc(filter, address, normalized, read);
    cudaTextureObject_t t = 0;
    CUDA_OK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    return t;
}

static cudaResourceDesc array_resource(cudaArray_t a)
{
    cudaResourceDesc r;
    memset(&r, 0, sizeof r);
    r.resType = cudaResourceTypeArray;
    r.res.array.array = a;
    return r;
}

int main()
{
    g_program = "textures";
    // ---- a 2-D float array, filled row by row --------------------------------
    std::vector<float> host(W * H);
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) host[y * W + x] = value_at(x, y);
    size_t free0 = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free0, &total));
    cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
    cudaArray_t arr = nullptr;
    CUDA_OK(cudaMallocArray(&arr, &fdesc, W, H));
    CUDA_OK(cudaMemcpy2DToArray(arr, 0, 0, host.data(), W * sizeof(float), W * sizeof(float), H,
                                cudaMemcpyHostToDevice));

    {
        cudaChannelFormatDesc d;
        cudaExtent e;
        unsigned flags = 99;
        CUDA_OK(cudaArrayGetInfo(&d, &e, &flags, arr));
        CHECK("cudaArrayGetInfo reports the array", d.x == 32 && d.f == cudaChannelFormatKindFloat &&
                  e.width == W && e.height == H && e.depth == 0 && flags == 0,
              "x %d kind %d extent %zux%zux%zu flags %u", d.x, (int)d.f, e.width, e.height, e.depth,
              flags);
    }

    // Back out of the array: the bytes that went in.
    {
        std::vector<float> back(W * H, -1.0f);
        CUDA_OK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), arr, 0, 0, W * sizeof(float),
                                      H, cudaMemcpyDeviceToHost));
        CHECK("an array gives back what was copied in", back == host, "first %g", back[0]);
        // A sub-rectangle: columns 3..6 of rows 2..4.
        float sub[3][4];
        CUDA_OK(cudaMemcpy2DFromArray(sub, 4 * sizeof(float), arr, 3 * sizeof(float), 2,
                                      4 * sizeof(float), 3, cudaMemcpyDeviceToHost));
        bool same = true;
        for (int y = 0; y < 3; ++y)
            for (int x = 0; x < 4; ++x) same &= sub[y][x] == value_at(3 + x, 2 + y);
        CHECK("a sub-rectangle of an array", same, "sub[0][0] %g", sub[0][0]);
        cudaError_t e = cudaMemcpy2DFromArray(sub, 4 * sizeof(float), arr, 14 * sizeof(float), 0,
                                              4 * sizeof(float), 1, cudaMemcpyDeviceToHost);
        CHECK("a copy past an array's row is refused", e == cudaErrorInvalidValue, "%s",
              cudaGetErrorName(e));
        cudaGetLastError();
    }

    // Array to array, asynchronous copies on a stream, the channel format and the memory an
    // array needs.
    {
        cudaArray_t copy = nullptr;
        CUDA_OK(cudaMallocArray(&copy, &fdesc, W, H));
        CUDA_OK(cudaMemcpy2DArrayToArray(copy, 0, 0, arr, 0, 0, W * sizeof(float), H,
                                         cudaMemcpyDeviceToDevice));
        cudaStream_t st;
        CUDA_OK(cudaStreamCreate(&st));
        std::vector<float> back(W * H, -1.0f);
        CUDA_OK(cudaMemcpy2DFromArrayAsync(back.data(), W * sizeof(float), copy, 0, 0,
                                           W * sizeof(float), H, cudaMemcpyDeviceToHost, st));
        CUDA_OK(cudaStreamSynchronize(st));
        CHECK("an array copied to another array, read back on a stream", back == host, "back[5] %g",
              back[5]);
        std::vector<float> row(W, 7.0f);
        CUDA_OK(cudaMemcpy2DToArrayAsync(copy, 0, 3, row.data(), W * sizeof(float), W * sizeof(float), 1,
                                         cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemcpy2DFromArrayAsync(back.data(), W * sizeof(float), copy, 0, 0,
                                           W * sizeof(float), H, cudaMemcpyDeviceToHost, st));
        CUDA_OK(cudaStreamSynchronize(st));
        CHECK("an asynchronous copy into row 3 of an array", back[3 * W] == 7.0f && back[4 * W - 1] == 7.0f &&
                  back[2 * W] == host[2 * W] && back[4 * W] == host[4 * W],
              "%g %g", back[3 * W], back[4 * W]);
        cudaChannelFormatDesc got;
        CUDA_OK(cudaGetChannelDesc(&got, copy));
        CHECK("cudaGetChannelDesc", got.x == 32 && got.y == 0 && got.f == cudaChannelFormatKindFloat, "x %d kind %d",
              got.x, (int)got.f);
        cudaArrayMemoryRequirements req;
        CUDA_OK(cudaArrayGetMemoryRequirements(&req, copy, 0));
        CHECK("cudaArrayGetMemoryRequirements covers the texels", req.size >= W * H * sizeof(float) &&
                  req.alignment > 0,
              "size %zu alignment %zu", req.size, req.alignment);
        CUDA_OK(cudaStreamDestroy(st));
        CUDA_OK(cudaFreeArray(copy));
        // Mipmapped arrays (mipmaps.cu has the rest): level 1 is half the array each way.
        cudaMipmappedArray_t mip = nullptr;
        CUDA_OK(cudaMallocMipmappedArray(&mip, &fdesc, make_cudaExtent(W, H, 0), 2));
        cudaArray_t level = nullptr;
        CUDA_OK(cudaGetMipmappedArrayLevel(&level, mip, 1));
        cudaExtent le = make_cudaExtent(0, 0, 0);
        CUDA_OK(cudaArrayGetInfo(nullptr, &le, nullptr, level));
        CHECK("a mipmapped array's level 1 is half its size", le.width == W / 2 && le.height == H / 2,
              "%zux%zu", le.width, le.height);
        CUDA_OK(cudaFreeMipmappedArray(mip));
    }

    float *dout = nullptr;
    CUDA_OK(cudaMalloc(&dout, 64 * 64 * sizeof(float)));
    std::vector<float> out(64 * 64);

    // ---- point sampling at texel centres, unnormalized ----------------------
    cudaResourceDesc res = array_resource(arr);
    cudaTextureObject_t point = texture_of(res, cudaFilterModePoint, cudaAddressModeClamp, false);
    sample_2d<<<H, W>>>(point, dout, 0.5f, 0.5f);
    CUDA_OK(cudaMemcpy(out.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    {
        int bad = -1;
        for (int i = 0; i < W * H && bad < 0; ++i)
            if (out[i] != host[i]) bad = i;
        CHECK("tex2D reads every texel of a 2-D array", bad < 0, "texel %d: %g, want %g", bad,
              bad < 0 ? 0.0 : out[bad], bad < 0 ? 0.0 : host[bad]);
    }

    // Clamped and linearly filtered reads at chosen coordinates.
    float2 at[4] = {{-3.0f, -3.0f}, {W + 5.0f, H + 5.0f}, {1.25f, 0.5f}, {2.0f, 1.0f}};
    float2 *dat = nullptr;
    CUDA_OK(cudaMalloc(&dat, sizeof at));
    CUDA_OK(cudaMemcpy(dat, at, sizeof at, cudaMemcpyHostToDevice));
    sample_at<<<1, 2>>>(point, dat, dout);
    CUDA_OK(cudaMemcpy(out.data(), dout, 2 * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK("clamp addressing holds coordinates to the edges",
          out[0] == value_at(0, 0) && out[1] == value_at(W - 1, H - 1), "%g %g", out[0], out[1]);

    cudaTextureObject_t linear = texture_of(res, cudaFilterModeLinear, cudaAddressModeClamp, false);
    sample_at<<<1, 4>>>(linear, dat, dout);
    CUDA_OK(cudaMemcpy(out.data(), dout, 4 * sizeof(float), cudaMemcpyDeviceToHost));
    // (1.25, 0.5): 3/4 of the way from texel 0 to texel 1 of row 0.
    // (2.0, 1.0): the mean of texels (1,0), (2,0), (1,1), (2,1).
    float want2 = value_at(0, 0) + 0.75f * (value_at(1, 0) - value_at(0, 0));
    float want3 = (value_at(1, 0) + value_at(2, 0) + value_at(1, 1) + value_at(2, 1)) / 4.0f;
    CHECK("linear filtering interpolates between texels",
          fabsf(out[2] - want2) < 1e-3f && fabsf(out[3] - want3) < 1e-3f, "%g (want %g), %g (want %g)",
          out[2], want2, out[3], want3);

    // tex2Dgather: the red channel of the four texels bilinear filtering would use at (3, 2).
    float4 *dg = nullptr;
    CUDA_OK(cudaMalloc(&dg, sizeof(float4)));
    gather<<<1, 1>>>(point, dg);
    float4 g;
    CUDA_OK(cudaMemcpy(&g, dg, sizeof g, cudaMemcpyDeviceToHost));
    CHECK("tex2Dgather returns the four texels around a point",
          g.x == value_at(2, 2) && g.y == value_at(3, 2) && g.z == value_at(3, 1) && g.w == value_at(2, 1),
          "%g %g %g %g", g.x, g.y, g.z, g.w);

    {
        cudaResourceDesc back;
        CUDA_OK(cudaGetTextureObjectResourceDesc(&back, linear));
        cudaTextureDesc tback;
        CUDA_OK(cudaGetTextureObjectTextureDesc(&tback, linear));
        CHECK("a texture object's descriptors read back",
              back.resType == cudaResourceTypeArray && back.res.array.array == arr &&
                  tback.filterMode == cudaFilterModeLinear,
              "type %d array %p filter %d", (int)back.resType, (void *)back.res.array.array,
              (int)tback.filterMode);
    }

    // ---- normalized coordinates: wrap and border on a 1-D array --------------
    {
        constexpr int N = 8;
        float line[N];
        for (int i = 0; i < N; ++i) line[i] = 10.0f + i;
        cudaArray_t a1 = nullptr;
        CUDA_OK(cudaMallocArray(&a1, &fdesc, N, 0));
        CUDA_OK(cudaMemcpy2DToArray(a1, 0, 0, line, sizeof line, sizeof line, 1, cudaMemcpyHostToDevice));
        cudaResourceDesc r1 = array_resource(a1);
        cudaTextureObject_t wrap = texture_of(r1, cudaFilterModePoint, cudaAddressModeWrap, true);
        cudaTextureObject_t border = texture_of(r1, cudaFilterModePoint, cudaAddressModeBorder, true);
        float us[4] = {0.5f / N, 1.0f + 2.5f / N, -0.5f / N, 1.5f};
        float *du = nullptr;
        CUDA_OK(cudaMalloc(&du, sizeof us));
        CUDA_OK(cudaMemcpy(du, us, sizeof us, cudaMemcpyHostToDevice));
        sample_1d<<<1, 4>>>(wrap, du, dout);
        CUDA_OK(cudaMemcpy(out.data(), dout, 4 * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("normalized coordinates wrap around a 1-D array",
              out[0] == 10.0f && out[1] == 12.0f && out[2] == 17.0f, "%g %g %g", out[0], out[1], out[2]);
        sample_1d<<<1, 4>>>(border, du, dout);
        CUDA_OK(cudaMemcpy(out.data(), dout, 4 * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("border addressing reads zero outside", out[0] == 10.0f && out[2] == 0.0f && out[3] == 0.0f,
              "%g %g %g", out[0], out[2], out[3]);
        CUDA_OK(cudaDestroyTextureObject(wrap));
        CUDA_OK(cudaDestroyTextureObject(border));
        CUDA_OK(cudaFreeArray(a1));
        CUDA_OK(cudaFree(du));
    }

    // ---- 8-bit RGBA texels: normalized floats and raw elements --------------
    {
        constexpr int N = 4;
        uchar4 px[N] = {{0, 51, 102, 255}, {255, 0, 1, 2}, {10, 20, 30, 40}, {128, 64, 32, 16}};
        cudaChannelFormatDesc cd = cudaCreateChannelDesc<uchar4>();
        cudaArray_t a = nullptr;
        CUDA_OK(cudaMallocArray(&a, &cd, N, 0));
        CUDA_OK(cudaMemcpy2DToArray(a, 0, 0, px, sizeof px, sizeof px, 1, cudaMemcpyHostToDevice));
        cudaResourceDesc r = array_resource(a);
        cudaTextureObject_t nf = texture_of(r, cudaFilterModePoint, cudaAddressModeClamp, false,
                                            cudaReadModeNormalizedFloat);
        cudaTextureObject_t raw = texture_of(r, cudaFilterModePoint, cudaAddressModeClamp, false);
        float4 *df = nullptr;
        uint4 *du = nullptr;
        CUDA_OK(cudaMalloc(&df, N * sizeof(float4)));
        CUDA_OK(cudaMalloc(&du, N * sizeof(uint4)));
        sample_rgba<<<1, N>>>(nf, raw, df, du);
        float4 f[N];
        uint4 u[N];
        CUDA_OK(cudaMemcpy(f, df, sizeof f, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(u, du, sizeof u, cudaMemcpyDeviceToHost));
        bool fok = true, uok = true;
        for (int i = 0; i < N; ++i) {
            fok &= fabsf(f[i].x - px[i].x / 255.0f) < 1e-6f && fabsf(f[i].y - px[i].y / 255.0f) < 1e-6f &&
                   fabsf(f[i].z - px[i].z / 255.0f) < 1e-6f && fabsf(f[i].w - px[i].w / 255.0f) < 1e-6f;
            uok &= u[i].x == px[i].x && u[i].y == px[i].y && u[i].z == px[i].z && u[i].w == px[i].w;
        }
        CHECK("8-bit texels read as normalized floats", fok, "texel 0: %g %g %g %g", f[0].x, f[0].y,
              f[0].z, f[0].w);
        CHECK("8-bit texels read as elements", uok, "texel 1: %u %u %u %u", u[1].x, u[1].y, u[1].z, u[1].w);
        CUDA_OK(cudaDestroyTextureObject(nf));
        CUDA_OK(cudaDestroyTextureObject(raw));
        CUDA_OK(cudaFreeArray(a));
        CUDA_OK(cudaFree(df));
        CUDA_OK(cudaFree(du));
    }

    // ---- tex1Dfetch over linear memory ---------------------------------------
    {
        constexpr int N = 32;
        int vals[N];
        for (int i = 0; i < N; ++i) vals[i] = i * i - 7;
        int *dv = nullptr, *dres = nullptr;
        CUDA_OK(cudaMalloc(&dv, sizeof vals));
        CUDA_OK(cudaMalloc(&dres, (N + 2) * sizeof(int)));
        CUDA_OK(cudaMemcpy(dv, vals, sizeof vals, cudaMemcpyHostToDevice));
        cudaResourceDesc r;
        memset(&r, 0, sizeof r);
        r.resType = cudaResourceTypeLinear;
        r.res.linear.devPtr = dv;
        r.res.linear.desc = cudaCreateChannelDesc<int>();
        r.res.linear.sizeInBytes = sizeof vals;
        cudaTextureObject_t t = texture_of(r, cudaFilterModePoint, cudaAddressModeClamp, false);
        fetch_linear<<<1, N + 2>>>(t, dres);
        int got[N + 2];
        CUDA_OK(cudaMemcpy(got, dres, sizeof got, cudaMemcpyDeviceToHost));
        bool same = true;
        for (int i = 0; i < N; ++i) same &= got[i] == vals[i];
        CHECK("tex1Dfetch reads linear memory by index", same, "got[5] %d", got[5]);
        CHECK("tex1Dfetch past the end reads zero", got[N] == 0 && got[N + 1] == 0, "%d %d", got[N],
              got[N + 1]);
        CUDA_OK(cudaDestroyTextureObject(t));
        CUDA_OK(cudaFree(dv));
        CUDA_OK(cudaFree(dres));
    }

    // ---- pitched memory -------------------------------------------------------
    {
        float *pm = nullptr;
        size_t pitch = 0;
        CUDA_OK(cudaMallocPitch(&pm, &pitch, W * sizeof(float), H));
        CUDA_OK(cudaMemcpy2D(pm, pitch, host.data(), W * sizeof(float), W * sizeof(float), H,
                             cudaMemcpyHostToDevice));
        cudaResourceDesc r;
        memset(&r, 0, sizeof r);
        r.resType = cudaResourceTypePitch2D;
        r.res.pitch2D.devPtr = pm;
        r.res.pitch2D.desc = fdesc;
        r.res.pitch2D.width = W;
        r.res.pitch2D.height = H;
        r.res.pitch2D.pitchInBytes = pitch;
        cudaTextureObject_t t = texture_of(r, cudaFilterModePoint, cudaAddressModeClamp, false);
        sample_2d<<<H, W>>>(t, dout, 0.5f, 0.5f);
        CUDA_OK(cudaMemcpy(out.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
        bool same = true;
        for (int i = 0; i < W * H; ++i) same &= out[i] == host[i];
        CHECK("tex2D reads pitched memory", same, "out[17] %g", out[17]);
        // A pitch that is not a multiple of the texture pitch alignment is refused.
        r.res.pitch2D.pitchInBytes = pitch + 4;
        cudaTextureDesc td;
        memset(&td, 0, sizeof td);
        cudaTextureObject_t bad = 0;
        cudaError_t e = cudaCreateTextureObject(&bad, &r, &td, nullptr);
        CHECK("a misaligned pitch is refused", e == cudaErrorInvalidValue, "%s", cudaGetErrorName(e));
        cudaGetLastError();
        CUDA_OK(cudaDestroyTextureObject(t));
        CUDA_OK(cudaFree(pm));
    }

    // ---- a 3-D array ----------------------------------------------------------
    {
        constexpr int N = 4;
        float vol[N][N][N];
        for (int z = 0; z < N; ++z)
            for (int y = 0; y < N; ++y)
                for (int x = 0; x < N; ++x) vol[z][y][x] = z * 1000.0f + y * 10.0f + x;
        cudaArray_t a = nullptr;
        CUDA_OK(cudaMalloc3DArray(&a, &fdesc, make_cudaExtent(N, N, N)));
        cudaMemcpy3DParms p;
        memset(&p, 0, sizeof p);
        p.srcPtr = make_cudaPitchedPtr(vol, N * sizeof(float), N, N);
        p.dstArray = a;
        p.extent = make_cudaExtent(N, N, N);
        p.kind = cudaMemcpyHostToDevice;
        CUDA_OK(cudaMemcpy3D(&p));
        cudaTextureObject_t t = texture_of(array_resource(a), cudaFilterModePoint, cudaAddressModeClamp, false);
        sample_3d<<<1, dim3(N, N, N)>>>(t, dout, N);
        CUDA_OK(cudaMemcpy(out.data(), dout, N * N * N * sizeof(float), cudaMemcpyDeviceToHost));
        bool same = true;
        for (int i = 0; i < N * N * N; ++i) same &= out[i] == (&vol[0][0][0])[i];
        CHECK("tex3D reads every voxel of a 3-D array", same, "out[21] %g", out[21]);
        CUDA_OK(cudaDestroyTextureObject(t));
        CUDA_OK(cudaFreeArray(a));
    }

    // ---- a resource view reading the float array's texels as 32-bit integers ----
    {
        cudaResourceDesc ar = array_resource(arr);
        cudaTextureDesc td = texture_desc(cudaFilterModePoint, cudaAddressModeClamp, false);
        cudaResourceViewDesc view;
        memset(&view, 0, sizeof view);
        view.format = cudaResViewFormatUnsignedInt1;
        view.width = W;
        view.height = H;
        cudaTextureObject_t tv = 0;
        CUDA_OK(cudaCreateTextureObject(&tv, &ar, &td, &view));
        unsigned *dbits = nullptr;
        CUDA_OK(cudaMalloc(&dbits, W * H * sizeof(unsigned)));
        sample_bits<<<H, W>>>(tv, dbits);
        std::vector<unsigned> bits(W * H);
        CUDA_OK(cudaMemcpy(bits.data(), dbits, W * H * sizeof(unsigned), cudaMemcpyDeviceToHost));
        bool same = true;
        for (int i = 0; i < W * H; ++i) {
            unsigned want;
            memcpy(&want, &host[i], sizeof want);
            same &= bits[i] == want;
        }
        CHECK("a resource view reads float texels as their bits", same, "texel 5: %#x", bits[5]);
        view.format = cudaResViewFormatHalf1;
        cudaTextureObject_t bad = 0;
        cudaError_t e = cudaCreateTextureObject(&bad, &ar, &td, &view);
        CHECK("a view of another texel size is refused", e == cudaErrorInvalidValue, "%s", cudaGetErrorName(e));
        cudaGetLastError();
        CUDA_OK(cudaDestroyTextureObject(tv));
        CUDA_OK(cudaFree(dbits));
    }

    // ---- a layered 2-D array --------------------------------------------------
    {
        constexpr int N = 4, L = 3;
        float layers[L][N][N];
        for (int l = 0; l < L; ++l)
            for (int y = 0; y < N; ++y)
                for (int x = 0; x < N; ++x) layers[l][y][x] = l * 500.0f + y * N + x;
        cudaArray_t a = nullptr;
        CUDA_OK(cudaMalloc3DArray(&a, &fdesc, make_cudaExtent(N, N, L), cudaArrayLayered));
        cudaMemcpy3DParms p;
        memset(&p, 0, sizeof p);
        p.srcPtr = make_cudaPitchedPtr(layers, N * sizeof(float), N, N);
        p.dstArray = a;
        p.extent = make_cudaExtent(N, N, L);
        p.kind = cudaMemcpyHostToDevice;
        CUDA_OK(cudaMemcpy3D(&p));
        cudaTextureObject_t t = texture_of(array_resource(a), cudaFilterModePoint, cudaAddressModeClamp, false);
        sample_layered<<<L, dim3(N, N)>>>(t, dout, N);
        CUDA_OK(cudaMemcpy(out.data(), dout, L * N * N * sizeof(float), cudaMemcpyDeviceToHost));
        bool same = true;
        for (int i = 0; i < L * N * N; ++i) same &= out[i] == (&layers[0][0][0])[i];
        CHECK("tex2DLayered reads every layer", same, "out[20] %g", out[20]);
        // A resource view of layers 1 and 2: its layer 0 is the array's layer 1.
        cudaResourceDesc ar = array_resource(a);
        cudaTextureDesc td = texture_desc(cudaFilterModePoint, cudaAddressModeClamp, false);
        cudaResourceViewDesc view;
        memset(&view, 0, sizeof view);
        view.format = cudaResViewFormatFloat1;
        view.width = N;
        view.height = N;
        view.depth = L;
        view.firstLayer = 1;
        view.lastLayer = 2;
        cudaTextureObject_t tv = 0;
        CUDA_OK(cudaCreateTextureObject(&tv, &ar, &td, &view));
        sample_layered<<<2, dim3(N, N)>>>(tv, dout, N);
        CUDA_OK(cudaMemcpy(out.data(), dout, 2 * N * N * sizeof(float), cudaMemcpyDeviceToHost));
        same = true;
        for (int i = 0; i < 2 * N * N; ++i) same &= out[i] == (&layers[1][0][0])[i];
        CHECK("a resource view of layers 1 and 2", same, "out[0] %g", out[0]);
        cudaResourceViewDesc vback;
        CUDA_OK(cudaGetTextureObjectResourceViewDesc(&vback, tv));
        CHECK("the view reads back", vback.firstLayer == 1 && vback.lastLayer == 2, "layers %u-%u",
              vback.firstLayer, vback.lastLayer);
        view.firstLayer = 2;
        view.lastLayer = 3;
        cudaTextureObject_t bad = 0;
        cudaError_t e = cudaCreateTextureObject(&bad, &ar, &td, &view);
        CHECK("a view of a layer past the last is refused", e == cudaErrorInvalidValue, "%s",
              cudaGetErrorName(e));
        cudaGetLastError();
        CUDA_OK(cudaDestroyTextureObject(tv));
        CUDA_OK(cudaDestroyTextureObject(t));
        CUDA_OK(cudaFreeArray(a));
    }

    // ---- surfaces -------------------------------------------------------------
    {
        cudaArray_t a = nullptr;
        CUDA_OK(cudaMallocArray(&a, &fdesc, W, H, cudaArraySurfaceLoadStore));
        CUDA_OK(cudaMemcpy2DToArray(a, 0, 0, host.data(), W * sizeof(float), W * sizeof(float), H,
                                    cudaMemcpyHostToDevice));
        cudaResourceDesc r = array_resource(a);
        cudaSurfaceObject_t s = 0;
        CUDA_OK(cudaCreateSurfaceObject(&s, &r));
        double_in_place<<<H, W>>>(s);
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> back(W * H);
        CUDA_OK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), a, 0, 0, W * sizeof(float), H,
                                      cudaMemcpyDeviceToHost));
        bool same = true;
        for (int i = 0; i < W * H; ++i) same &= back[i] == host[i] * 2.0f + 1.0f;
        CHECK("surf2Dread and surf2Dwrite update an array in place", same, "back[9] %g (want %g)", back[9],
              host[9] * 2.0f + 1.0f);
        CUDA_OK(cudaDestroySurfaceObject(s));
        CUDA_OK(cudaFreeArray(a));

        // An array made without cudaArraySurfaceLoadStore cannot back a surface.
        cudaError_t e = cudaCreateSurfaceObject(&s, &res);
        CHECK("a surface needs an array made for surface load/store", e == cudaErrorInvalidValue, "%s",
              cudaGetErrorName(e));
        cudaGetLastError();
    }

    // ---- the slice is charged for an array's memory ---------------------------
    {
        size_t before = 0, after = 0, freed = 0;
        CUDA_OK(cudaMemGetInfo(&before, &total));
        cudaArray_t big = nullptr;
        CUDA_OK(cudaMallocArray(&big, &fdesc, 1024, 1024));
        CUDA_OK(cudaMemGetInfo(&after, &total));
        CUDA_OK(cudaFreeArray(big));
        CUDA_OK(cudaMemGetInfo(&freed, &total));
        CHECK("a 4 MiB array is charged to the slice and given back",
              before - after >= (4u << 20) && freed == before, "before %zu after %zu freed %zu", before,
              after, freed);
        cudaArray_t huge = nullptr;
        cudaError_t e = cudaMallocArray(&huge, &fdesc, 65536, 65536);
        CHECK("an array larger than the slice is refused", e == cudaErrorMemoryAllocation, "%s",
              cudaGetErrorName(e));
        cudaGetLastError();
    }

    // ---- cube maps: six square faces, a layered cube map's faces per layer -------
    {
        constexpr int CW = 8, CUBES = 2;
        std::vector<float> faces(6 * CUBES * CW * CW);
        for (size_t i = 0; i < faces.size(); ++i) faces[i] = float(i) * 0.5f + 1.0f;
        cudaArray_t cube = nullptr, layered = nullptr;
        CUDA_OK(cudaMalloc3DArray(&cube, &fdesc, make_cudaExtent(CW, CW, 6), cudaArrayCubemap));
        CUDA_OK(cudaMalloc3DArray(&layered, &fdesc, make_cudaExtent(CW, CW, 6 * CUBES),
                                  cudaArrayCubemap | cudaArrayLayered));
        cudaMemcpy3DParms p;
        memset(&p, 0, sizeof p);
        p.srcPtr = make_cudaPitchedPtr(faces.data(), CW * sizeof(float), CW, CW);
        p.dstArray = cube;
        p.extent = make_cudaExtent(CW, CW, 6);
        p.kind = cudaMemcpyHostToDevice;
        CUDA_OK(cudaMemcpy3D(&p));
        p.dstArray = layered;
        p.extent = make_cudaExtent(CW, CW, 6 * CUBES);
        CUDA_OK(cudaMemcpy3D(&p));
        cudaResourceDesc cr = array_resource(cube), lr = array_resource(layered);
        cudaTextureObject_t tc = texture_of(cr, cudaFilterModePoint, cudaAddressModeWrap, true);
        cudaTextureObject_t tl = texture_of(lr, cudaFilterModePoint, cudaAddressModeWrap, true);
        float *dfaces = nullptr;
        CUDA_OK(cudaMalloc(&dfaces, 6 * CW * CW * sizeof(float)));
        std::vector<float> got(6 * CW * CW);
        cube_faces<<<CW, CW>>>(tc, dfaces, CW, false, 0);
        CUDA_OK(cudaMemcpy(got.data(), dfaces, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("texCubemap reads every texel of every face (the CUDA sample's directions)",
              std::equal(got.begin(), got.end(), faces.begin()), "face 3 texel 0: %g, want %g",
              got[3 * CW * CW], faces[3 * CW * CW]);
        cube_faces<<<CW, CW>>>(tl, dfaces, CW, true, 1);
        CUDA_OK(cudaMemcpy(got.data(), dfaces, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("texCubemapLayered reads the faces of layer 1",
              std::equal(got.begin(), got.end(), faces.begin() + 6 * CW * CW), "face 0 texel 0: %g, want %g",
              got[0], faces[6 * CW * CW]);
        cudaArray_t bad = nullptr;
        cudaError_t e = cudaMalloc3DArray(&bad, &fdesc, make_cudaExtent(CW, CW + 1, 6), cudaArrayCubemap);
        CHECK("a cube map with faces that are not square is refused", e == cudaErrorInvalidValue, "%s",
              cudaGetErrorName(e));
        cudaGetLastError();
        e = cudaMalloc3DArray(&bad, &fdesc, make_cudaExtent(CW, CW, 5), cudaArrayCubemap);
        CHECK("a cube map of five faces is refused", e == cudaErrorInvalidValue, "%s", cudaGetErrorName(e));
        cudaGetLastError();
        // A surface writes every face; copies read the faces back as layers.
        cudaArray_t sc = nullptr;
        CUDA_OK(cudaMalloc3DArray(&sc, &fdesc, make_cudaExtent(CW, CW, 6),
                                  cudaArrayCubemap | cudaArraySurfaceLoadStore));
        cudaResourceDesc sr = array_resource(sc);
        cudaSurfaceObject_t so = 0;
        CUDA_OK(cudaCreateSurfaceObject(&so, &sr));
        cube_surface<<<CW, CW>>>(so, CW);
        std::vector<float> back(6 * CW * CW, -1.0f);
        memset(&p, 0, sizeof p);
        p.srcArray = sc;
        p.dstPtr = make_cudaPitchedPtr(back.data(), CW * sizeof(float), CW, CW);
        p.extent = make_cudaExtent(CW, CW, 6);
        p.kind = cudaMemcpyDeviceToHost;
        CUDA_OK(cudaMemcpy3D(&p));
        bool same = true;
        for (int f = 0; f < 6; ++f)
            for (int y = 0; y < CW; ++y)
                for (int x = 0; x < CW; ++x) same &= back[(f * CW + y) * CW + x] == float(f * 1000 + y * 10 + x);
        CHECK("surfCubemapwrite writes every face", same, "face 5 texel 0: %g", back[5 * CW * CW]);
        CUDA_OK(cudaDestroySurfaceObject(so));
        CUDA_OK(cudaDestroyTextureObject(tc));
        CUDA_OK(cudaDestroyTextureObject(tl));
        CUDA_OK(cudaFreeArray(cube));
        CUDA_OK(cudaFreeArray(layered));
        CUDA_OK(cudaFreeArray(sc));
        CUDA_OK(cudaFree(dfaces));
    }

    CUDA_OK(cudaDestroyTextureObject(point));
    CUDA_OK(cudaDestroyTextureObject(linear));
    CUDA_OK(cudaFreeArray(arr));
    CUDA_OK(cudaFree(dout));
    CUDA_OK(cudaFree(dat));
    CUDA_OK(cudaFree(dg));
    size_t free1 = 0;
    CUDA_OK(cudaMemGetInfo(&free1, &total));
    CHECK("everything is given back", free1 == free0, "free %zu, was %zu", free1, free0);
    return finish();
}
