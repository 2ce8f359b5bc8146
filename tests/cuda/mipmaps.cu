// Mipmapped arrays through NVIDIA's runtime: cudaMallocMipmappedArray (2-D,
// 3-D, layered; the level count clamped as CUDA clamps it),
// cudaGetMipmappedArrayLevel and copies into each level, a mipmap chain built
// on the device the usual way (a texture over level l, a surface writing
// level l + 1), texture objects over the chain sampled with tex2DLod,
// tex2DGrad, tex3DLod and tex2DLayeredLod under point and linear mipmap
// filtering, a level bias and level clamps, the descriptors read back, and
// the slice charged for the chain and given back.
#include "check.h"

#include <vector>

constexpr int N = 16;      // the first level's side
constexpr int LEVELS = 5;  // 16, 8, 4, 2, 1

// Texel (x, y) of level l as the program fills it.
static float filled(int l, int x, int y) { return float(l * 1000 + y * 32 + x); }

__global__ void at_lod(cudaTextureObject_t t, const float *lods, float *out, float x, float y)
{
    int i = threadIdx.x;
    out[i] = tex2DLod<float>(t, x, y, lods[i]);
}

__global__ void at_grad(cudaTextureObject_t t, const float *grads, float *out, float x, float y)
{
    int i = threadIdx.x;
    out[i] = tex2DGrad<float>(t, x, y, make_float2(grads[i], 0.0f), make_float2(0.0f, grads[i]));
}

__global__ void plain(cudaTextureObject_t t, float *out, float x, float y)
{
    out[0] = tex2D<float>(t, x, y);
}

// Level l + 1 from level l: each texel the mean of the 2x2 texels under it (a bilinear fetch
// at their shared corner, normalized coordinates), written through a surface.
__global__ void downsample(cudaTextureObject_t finer, cudaSurfaceObject_t coarser, int n)
{
    int x = threadIdx.x, y = blockIdx.x;
    float v = tex2D<float>(finer, (2 * x + 1.0f) / (2 * n), (2 * y + 1.0f) / (2 * n));
    surf2Dwrite(v, coarser, x * (int)sizeof(float), y);
}

__global__ void misc(cudaTextureObject_t t3, cudaTextureObject_t tl, float lod, float *out)
{
    out[0] = tex3DLod<float>(t3, 0.5f, 0.5f, 0.5f, lod);
    out[1] = tex2DLayeredLod<float>(tl, 0.5f, 0.5f, 2, lod);
}

static cudaTextureObject_t texture_of(cudaResourceDesc &res, cudaTextureFilterMode filter,
                                      cudaTextureFilterMode mip_filter, float bias, float min_clamp,
                                      float max_clamp)
{
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
    td.filterMode = filter;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = 1;
    td.mipmapFilterMode = mip_filter;
    td.mipmapLevelBias = bias;
    td.minMipmapLevelClamp = min_clamp;
    td.maxMipmapLevelClamp = max_clamp;
    cudaTextureObject_t t = 0;
    CUDA_OK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    return t;
}

static cudaResourceDesc mipmapped(cudaMipmappedArray_t m)
{
    cudaResourceDesc r;
    memset(&r, 0, sizeof r);
    r.resType = cudaResourceTypeMipmappedArray;
    r.res.mipmap.mipmap = m;
    return r;
}

static cudaResourceDesc array_of(cudaArray_t a)
{
    cudaResourceDesc r;
    memset(&r, 0, sizeof r);
    r.resType = cudaResourceTypeArray;
    r.res.array.array = a;
    return r;
}

int main()
{
    g_program = "mipmaps";
    size_t free0 = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free0, &total));
    cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
    // Asking for more levels than a 16x16 array halves into gives the five it has.
    cudaMipmappedArray_t mip = nullptr;
    CUDA_OK(cudaMallocMipmappedArray(&mip, &fdesc, make_cudaExtent(N, N, 0), 12,
                                     cudaArraySurfaceLoadStore));
    {
        size_t free1 = 0;
        CUDA_OK(cudaMemGetInfo(&free1, &total));
        CHECK("a mipmapped array is charged to the slice", free0 - free1 >= N * N * sizeof(float),
              "%zu bytes", free0 - free1);
        bool sizes = true;
        for (int l = 0; l < LEVELS; ++l) {
            cudaArray_t a = nullptr;
            CUDA_OK(cudaGetMipmappedArrayLevel(&a, mip, l));
            cudaExtent e = make_cudaExtent(0, 0, 0);
            cudaChannelFormatDesc d;
            unsigned flags = 0;
            CUDA_OK(cudaArrayGetInfo(&d, &e, &flags, a));
            sizes &= e.width == size_t(N >> l) && e.height == size_t(N >> l) && e.depth == 0 &&
                     d.x == 32 && (flags & cudaArraySurfaceLoadStore);
        }
        CHECK("each level halves the one before", sizes, "a level's extent differs");
        cudaArray_t past = nullptr;
        cudaError_t e = cudaGetMipmappedArrayLevel(&past, mip, LEVELS);
        CHECK("the level count is clamped to the levels there are", e == cudaErrorInvalidValue,
              "%s", cudaGetErrorName(e));
        cudaGetLastError();
        cudaArrayMemoryRequirements req;
        CUDA_OK(cudaMipmappedArrayGetMemoryRequirements(&req, mip, 0));
        CHECK("the chain's memory requirements cover every level",
              req.size >= (N * N + 8 * 8 + 4 * 4 + 2 * 2 + 1) * sizeof(float) && req.alignment > 0,
              "size %zu alignment %zu", req.size, req.alignment);
    }

    // Every level filled from the host, each with values of its own.
    for (int l = 0; l < LEVELS; ++l) {
        int n = N >> l;
        std::vector<float> host(n * n);
        for (int y = 0; y < n; ++y)
            for (int x = 0; x < n; ++x) host[y * n + x] = filled(l, x, y);
        cudaArray_t a = nullptr;
        CUDA_OK(cudaGetMipmappedArrayLevel(&a, mip, l));
        CUDA_OK(cudaMemcpy2DToArray(a, 0, 0, host.data(), n * sizeof(float), n * sizeof(float), n,
                                    cudaMemcpyHostToDevice));
    }

    float *dlods = nullptr, *dout = nullptr;
    CUDA_OK(cudaMalloc(&dlods, 64 * sizeof(float)));
    CUDA_OK(cudaMalloc(&dout, 64 * sizeof(float)));
    float out[64];
    // The texel under normalized (0.3, 0.6) at level l.
    auto under = [](int l) {
        int n = N >> l;
        return filled(l, int(0.3f * n), int(0.6f * n));
    };
    cudaResourceDesc res = mipmapped(mip);

    // Point mipmap filtering: the nearest level, clamped to the levels there are.
    {
        float lods[] = {-2.0f, 0.0f, 0.4f, 0.6f, 1.0f, 2.2f, 3.5f, 4.0f, 9.0f};
        int want[] = {0, 0, 0, 1, 1, 2, 4, 4, 4};
        int n = sizeof lods / sizeof lods[0];
        cudaTextureObject_t t = texture_of(res, cudaFilterModePoint, cudaFilterModePoint, 0.0f, 0.0f, LEVELS - 1);
        CUDA_OK(cudaMemcpy(dlods, lods, sizeof lods, cudaMemcpyHostToDevice));
        at_lod<<<1, n>>>(t, dlods, dout, 0.3f, 0.6f);
        CUDA_OK(cudaMemcpy(out, dout, n * sizeof(float), cudaMemcpyDeviceToHost));
        int bad = -1;
        for (int i = 0; i < n && bad < 0; ++i)
            if (out[i] != under(want[i])) bad = i;
        CHECK("tex2DLod reads the nearest level", bad < 0, "lod %g: %g, want %g", lods[bad < 0 ? 0 : bad],
              out[bad < 0 ? 0 : bad], under(want[bad < 0 ? 0 : bad]));
        // tex2D on a mipmapped texture reads the first level.
        plain<<<1, 1>>>(t, dout, 0.3f, 0.6f);
        CUDA_OK(cudaMemcpy(out, dout, sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("tex2D reads the first level", out[0] == under(0), "%g", out[0]);
        // Gradients of 1, 2 and 4 first-level texels choose levels 0, 1 and 2.
        float grads[] = {1.0f / N, 2.0f / N, 4.0f / N, 16.0f / N};
        CUDA_OK(cudaMemcpy(dlods, grads, sizeof grads, cudaMemcpyHostToDevice));
        at_grad<<<1, 4>>>(t, dlods, dout, 0.3f, 0.6f);
        CUDA_OK(cudaMemcpy(out, dout, 4 * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("tex2DGrad chooses the level its gradients span",
              out[0] == under(0) && out[1] == under(1) && out[2] == under(2) && out[3] == under(4),
              "%g %g %g %g", out[0], out[1], out[2], out[3]);
        cudaResourceDesc back;
        CUDA_OK(cudaGetTextureObjectResourceDesc(&back, t));
        CHECK("the resource reads back as the mipmapped array",
              back.resType == cudaResourceTypeMipmappedArray && back.res.mipmap.mipmap == mip,
              "type %d", (int)back.resType);
        cudaTextureDesc td;
        CUDA_OK(cudaGetTextureObjectTextureDesc(&td, t));
        CHECK("the mipmap fields read back", td.mipmapFilterMode == cudaFilterModePoint &&
                  td.maxMipmapLevelClamp == LEVELS - 1,
              "filter %d max %g", (int)td.mipmapFilterMode, td.maxMipmapLevelClamp);
        // A mipmapped array a texture still names cannot go.
        cudaError_t e = cudaFreeMipmappedArray(mip);
        CHECK("a mipmapped array a texture names is not freed", e != cudaSuccess, "%s",
              cudaGetErrorName(e));
        cudaGetLastError();
        CUDA_OK(cudaDestroyTextureObject(t));
    }

    // A bias and clamps: every level one up, never past level 2 nor below level 1.
    {
        float lods[] = {-1.0f, 0.0f, 0.6f, 3.0f};
        int want[] = {1, 1, 2, 2};
        cudaTextureObject_t t = texture_of(res, cudaFilterModePoint, cudaFilterModePoint, 1.0f, 1.0f, 2.0f);
        CUDA_OK(cudaMemcpy(dlods, lods, sizeof lods, cudaMemcpyHostToDevice));
        at_lod<<<1, 4>>>(t, dlods, dout, 0.3f, 0.6f);
        CUDA_OK(cudaMemcpy(out, dout, 4 * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("a level bias and clamps", out[0] == under(want[0]) && out[1] == under(want[1]) &&
                  out[2] == under(want[2]) && out[3] == under(want[3]),
              "%g %g %g %g", out[0], out[1], out[2], out[3]);
        CUDA_OK(cudaDestroyTextureObject(t));
    }

    // A resource view of levels 1 to 3: level 1 is its level 0, clamps count from there.
    {
        float lods[] = {0.0f, 1.0f, 2.0f, 5.0f};
        int want[] = {1, 2, 3, 3};
        cudaTextureDesc td;
        memset(&td, 0, sizeof td);
        td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
        td.filterMode = cudaFilterModePoint;
        td.readMode = cudaReadModeElementType;
        td.normalizedCoords = 1;
        td.mipmapFilterMode = cudaFilterModePoint;
        td.maxMipmapLevelClamp = 8.0f;
        cudaResourceViewDesc view;
        memset(&view, 0, sizeof view);
        view.format = cudaResViewFormatFloat1;
        view.width = N;
        view.height = N;
        view.firstMipmapLevel = 1;
        view.lastMipmapLevel = 3;
        cudaTextureObject_t t = 0;
        CUDA_OK(cudaCreateTextureObject(&t, &res, &td, &view));
        CUDA_OK(cudaMemcpy(dlods, lods, sizeof lods, cudaMemcpyHostToDevice));
        at_lod<<<1, 4>>>(t, dlods, dout, 0.3f, 0.6f);
        CUDA_OK(cudaMemcpy(out, dout, 4 * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK("a resource view of levels 1 to 3", out[0] == under(want[0]) && out[1] == under(want[1]) &&
                  out[2] == under(want[2]) && out[3] == under(want[3]),
              "%g %g %g %g", out[0], out[1], out[2], out[3]);
        CUDA_OK(cudaDestroyTextureObject(t));
    }

    // Linear mipmap filtering blends the two levels around the level of detail.
    {
        float lods[] = {1.0f, 1.25f, 1.5f, 3.75f};
        cudaTextureObject_t t = texture_of(res, cudaFilterModePoint, cudaFilterModeLinear, 0.0f, 0.0f, LEVELS - 1);
        CUDA_OK(cudaMemcpy(dlods, lods, sizeof lods, cudaMemcpyHostToDevice));
        at_lod<<<1, 4>>>(t, dlods, dout, 0.3f, 0.6f);
        CUDA_OK(cudaMemcpy(out, dout, 4 * sizeof(float), cudaMemcpyDeviceToHost));
        bool near = true;
        for (int i = 0; i < 4; ++i) {
            int l = int(lods[i]);
            float w = lods[i] - l;
            float want = under(l) * (1 - w) + under(l + 1) * w;
            near &= fabsf(out[i] - want) <= 1e-3f * fabsf(want);
        }
        CHECK("linear mipmap filtering blends two levels", near, "%g %g %g %g", out[0], out[1],
              out[2], out[3]);
        CUDA_OK(cudaDestroyTextureObject(t));
    }

    // A chain built on the device: level l + 1 the 2x2 means of level l, through a texture
    // over level l and a surface over level l + 1.
    {
        for (int l = 0; l + 1 < LEVELS; ++l) {
            cudaArray_t finer = nullptr, coarser = nullptr;
            CUDA_OK(cudaGetMipmappedArrayLevel(&finer, mip, l));
            CUDA_OK(cudaGetMipmappedArrayLevel(&coarser, mip, l + 1));
            cudaResourceDesc fr = array_of(finer), cr = array_of(coarser);
            cudaTextureObject_t t = texture_of(fr, cudaFilterModeLinear, cudaFilterModePoint, 0, 0, 0);
            cudaSurfaceObject_t s = 0;
            CUDA_OK(cudaCreateSurfaceObject(&s, &cr));
            int n = N >> (l + 1);
            downsample<<<n, n>>>(t, s, n);
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaDestroySurfaceObject(s));
            CUDA_OK(cudaDestroyTextureObject(t));
        }
        // What the levels must hold: the means of the means, computed here.
        std::vector<float> level(N * N);
        for (int y = 0; y < N; ++y)
            for (int x = 0; x < N; ++x) level[y * N + x] = filled(0, x, y);
        bool same = true;
        float got_last = -1, want_last = -1;
        for (int l = 1; l < LEVELS; ++l) {
            int n = N >> l;
            std::vector<float> next(n * n), got(n * n);
            for (int y = 0; y < n; ++y)
                for (int x = 0; x < n; ++x) {
                    int m = 2 * n;
                    next[y * n + x] = (level[2 * y * m + 2 * x] + level[2 * y * m + 2 * x + 1] +
                                       level[(2 * y + 1) * m + 2 * x] + level[(2 * y + 1) * m + 2 * x + 1]) /
                                      4;
                }
            cudaArray_t a = nullptr;
            CUDA_OK(cudaGetMipmappedArrayLevel(&a, mip, l));
            CUDA_OK(cudaMemcpy2DFromArray(got.data(), n * sizeof(float), a, 0, 0, n * sizeof(float), n,
                                          cudaMemcpyDeviceToHost));
            for (int i = 0; i < n * n; ++i) same &= fabsf(got[i] - next[i]) <= 1e-3f;
            got_last = got[0];
            want_last = next[0];
            level = next;
        }
        CHECK("a chain generated on the device through textures and surfaces", same,
              "last level %g, want %g", got_last, want_last);
    }
    CUDA_OK(cudaFreeMipmappedArray(mip));

    // 3-D and layered chains.
    {
        cudaMipmappedArray_t m3 = nullptr, ml = nullptr;
        CUDA_OK(cudaMallocMipmappedArray(&m3, &fdesc, make_cudaExtent(8, 8, 8), 4));
        CUDA_OK(cudaMallocMipmappedArray(&ml, &fdesc, make_cudaExtent(8, 8, 3), 4, cudaArrayLayered));
        bool layers_kept = true;
        for (int l = 0; l < 4; ++l) {
            int n = 8 >> l;
            cudaArray_t a3 = nullptr, al = nullptr;
            CUDA_OK(cudaGetMipmappedArrayLevel(&a3, m3, l));
            CUDA_OK(cudaGetMipmappedArrayLevel(&al, ml, l));
            std::vector<float> v3(n * n * n, float(10 + l)), vl(n * n * 3, float(20 + l));
            cudaMemcpy3DParms p;
            memset(&p, 0, sizeof p);
            p.srcPtr = make_cudaPitchedPtr(v3.data(), n * sizeof(float), n, n);
            p.dstArray = a3;
            p.extent = make_cudaExtent(n, n, n);
            p.kind = cudaMemcpyHostToDevice;
            CUDA_OK(cudaMemcpy3D(&p));
            p.srcPtr = make_cudaPitchedPtr(vl.data(), n * sizeof(float), n, n);
            p.dstArray = al;
            p.extent = make_cudaExtent(n, n, 3);
            CUDA_OK(cudaMemcpy3D(&p));
            cudaExtent e;
            CUDA_OK(cudaArrayGetInfo(nullptr, &e, nullptr, al));
            layers_kept &= e.width == size_t(n) && e.depth == 3;
        }
        CHECK("a layered chain keeps its layers at every level", layers_kept, "a level lost layers");
        cudaResourceDesc r3 = mipmapped(m3), rl = mipmapped(ml);
        cudaTextureObject_t t3 = texture_of(r3, cudaFilterModePoint, cudaFilterModePoint, 0, 0, 3);
        cudaTextureObject_t tl = texture_of(rl, cudaFilterModePoint, cudaFilterModePoint, 0, 0, 3);
        bool all = true;
        for (int l = 0; l < 4; ++l) {
            misc<<<1, 1>>>(t3, tl, float(l), dout);
            CUDA_OK(cudaMemcpy(out, dout, 2 * sizeof(float), cudaMemcpyDeviceToHost));
            all &= out[0] == float(10 + l) && out[1] == float(20 + l);
        }
        CHECK("tex3DLod and tex2DLayeredLod read each level", all, "level 3: %g %g", out[0], out[1]);
        CUDA_OK(cudaDestroyTextureObject(t3));
        CUDA_OK(cudaDestroyTextureObject(tl));
        CUDA_OK(cudaFreeMipmappedArray(m3));
        CUDA_OK(cudaFreeMipmappedArray(ml));
    }

    CUDA_OK(cudaFree(dlods));
    CUDA_OK(cudaFree(dout));
    size_t free2 = 0;
    CUDA_OK(cudaMemGetInfo(&free2, &total));
    CHECK("freeing the chains gives the slice back", free2 == free0, "%zu of %zu", free2, free0);
    return finish();
}
