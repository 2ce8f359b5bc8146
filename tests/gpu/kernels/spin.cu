// Spins until the GPU's global timer has advanced `ns` nanoseconds, then
// writes how long it spun: a kernel of a chosen duration on any device (the
// watchdog, kernel timing and scheduler-share checks of the conformance suite).
extern "C" __global__ void spin(unsigned long long ns, unsigned long long *out)
{
    unsigned long long start;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    now = start;
    while (now - start < ns) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        *out = now - start;
    }
}
