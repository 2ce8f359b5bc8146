// Texture and surface objects on any device (the conformance suite's
// `textures_and_surfaces` check): samples a 2-D float texture at texel
// centres, and scales a float surface in place.
extern "C" __global__ void sample_grid(cudaTextureObject_t t, float *out, int width)
{
    int x = threadIdx.x, y = blockIdx.x;
    out[y * width + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);
}

extern "C" __global__ void scale_surface(cudaSurfaceObject_t s, float k)
{
    int x = threadIdx.x, y = blockIdx.x;
    float v;
    surf2Dread(&v, s, x * (int)sizeof(float), y);
    surf2Dwrite(v * k, s, x * (int)sizeof(float), y);
}

// A mipmapped texture read at a level of detail (tex2DLod), at normalized
// coordinates: thread x of block y reads level `lod` at the centre of texel
// (x, y) of that level.
extern "C" __global__ void sample_level(cudaTextureObject_t t, float *out, int width, float lod)
{
    int x = threadIdx.x, y = blockIdx.x;
    int height = gridDim.x;
    out[y * width + x] = tex2DLod<float>(t, (x + 0.5f) / width, (y + 0.5f) / height, lod);
}
