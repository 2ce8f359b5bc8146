// One all-pairs n-body step in f64 with softening; rsqrt gives 1/|r|.
// pos: n x (x, y, z, mass); vel: n x (x, y, z). Writes new_pos and new_vel.
extern "C" __global__ void nbody_step(const double* pos, const double* vel, double* new_pos, double* new_vel,
                                      int n, double dt, double eps2)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double px = pos[4 * i], py = pos[4 * i + 1], pz = pos[4 * i + 2];
    double ax = 0.0, ay = 0.0, az = 0.0;
    for (int j = 0; j < n; ++j) {
        double dx = pos[4 * j] - px;
        double dy = pos[4 * j + 1] - py;
        double dz = pos[4 * j + 2] - pz;
        double d2 = dx * dx + dy * dy + dz * dz + eps2;
        double inv = rsqrt(d2);
        double s = pos[4 * j + 3] * inv * inv * inv;
        ax += dx * s;
        ay += dy * s;
        az += dz * s;
    }
    double vx = vel[3 * i] + ax * dt;
    double vy = vel[3 * i + 1] + ay * dt;
    double vz = vel[3 * i + 2] + az * dt;
    new_vel[3 * i] = vx;
    new_vel[3 * i + 1] = vy;
    new_vel[3 * i + 2] = vz;
    new_pos[4 * i] = px + vx * dt;
    new_pos[4 * i + 1] = py + vy * dt;
    new_pos[4 * i + 2] = pz + vz * dt;
    new_pos[4 * i + 3] = pos[4 * i + 3];
}
