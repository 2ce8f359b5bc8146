// Parameter packing: many parameters of mixed sizes and alignments, including a
// by-value struct. Thread 0 of block 0 echoes every parameter as 64-bit words;
// every thread also uses several parameters so all threads read the param space.
struct Mixed {
    char c;        // offset 0
    double d;      // offset 8
    short s;       // offset 16
    int i;         // offset 20
    float f[3];    // offset 24
};                 // size 40, align 8

extern "C" __global__ void many_params(char c, short s, int i, long long ll, float f, double d,
                                       unsigned char uc, Mixed st, const int* ptr, unsigned short us,
                                       unsigned long long* echo, long long* per_thread, int n)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t == 0) {
        echo[0] = (unsigned long long)(long long)c;
        echo[1] = (unsigned long long)(long long)s;
        echo[2] = (unsigned long long)(long long)i;
        echo[3] = (unsigned long long)ll;
        echo[4] = (unsigned long long)__float_as_uint(f);
        echo[5] = (unsigned long long)__double_as_longlong(d);
        echo[6] = (unsigned long long)uc;
        echo[7] = (unsigned long long)(long long)st.c;
        echo[8] = (unsigned long long)__double_as_longlong(st.d);
        echo[9] = (unsigned long long)(long long)st.s;
        echo[10] = (unsigned long long)(long long)st.i;
        echo[11] = (unsigned long long)__float_as_uint(st.f[0]);
        echo[12] = (unsigned long long)__float_as_uint(st.f[1]);
        echo[13] = (unsigned long long)__float_as_uint(st.f[2]);
        echo[14] = (unsigned long long)(long long)(ptr[0] + ptr[1]);
        echo[15] = (unsigned long long)us;
    }
    if (t < n) {
        per_thread[t] = ll * t + c + s + i + uc + us + st.i + st.c + ptr[t & 1];
    }
}
