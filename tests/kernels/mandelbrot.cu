// Mandelbrot escape counts in f32. Explicit round-to-nearest intrinsics keep the
// compiler from contracting into fma, so the CPU reference can match bit for bit.
extern "C" __global__ void mandelbrot(unsigned* iters, int w, int h, float x0, float y0, float dx, float dy, int max_iter)
{
    int px = blockIdx.x * blockDim.x + threadIdx.x;
    int py = blockIdx.y * blockDim.y + threadIdx.y;
    if (px >= w || py >= h) return;
    float cx = __fadd_rn(x0, __fmul_rn((float)px, dx));
    float cy = __fadd_rn(y0, __fmul_rn((float)py, dy));
    float x = 0.0f, y = 0.0f;
    int i = 0;
    while (i < max_iter) {
        float xx = __fmul_rn(x, x);
        float yy = __fmul_rn(y, y);
        if (__fadd_rn(xx, yy) > 4.0f) break;
        float xy = __fmul_rn(x, y);
        y = __fadd_rn(__fadd_rn(xy, xy), cy);
        x = __fadd_rn(__fsub_rn(xx, yy), cx);
        ++i;
    }
    iters[py * w + px] = (unsigned)i;
}
