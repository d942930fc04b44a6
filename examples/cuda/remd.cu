// Replica-exchange molecular dynamics (temperature REMD) of Lennard-Jones argon, the DS-CUDA
// benchmark workload: an ordinary CUDA runtime program, nothing Tandem-specific.
//
// Model: 256 atoms per replica, periodic cubic box at reduced density rho* = 0.8 (L = 6.84
// sigma = 2.329 nm, so the 3 sigma cut-off is below L/2 and the box is above 6 sigma), FCC
// lattice start (4x4x4 cells) with small random displacements, LJ eps = 0.9661 kJ/mol,
// sigma = 0.3405 nm, truncated and shifted at 3 sigma, mass 39.948 u. Units nm, ps, u,
// kJ/mol. Velocity Verlet, dt = 5 fs; Berendsen velocity rescaling (tau 0.5 ps) towards each
// replica's target temperature; targets 80 K .. 160 K geometric. Every 1,000 steps the host
// reads the potential energies and attempts exchanges between neighbouring temperatures
// (even pairs, then odd pairs, alternately) with the Metropolis criterion
// min(1, exp((1/kT_a - 1/kT_b)(U_a - U_b))) and a fixed-seed RNG; an accepted exchange swaps
// the two replicas' targets and rescales their velocities by sqrt(T_new/T_old).
//
// Devices: replica r lives on device r % cudaGetDeviceCount(), in that device's stream, for
// the whole run. One md_step launch per step per device does all its replicas (one block of
// 256 threads per replica: kick, drift, LJ forces, kick, thermostat). All sums run in double
// in a fixed order (no atomics), so every replica's trajectory is the same bits whatever the
// number of devices; the host synchronizes only at exchange points.
//
// Self-checks (exit 1 on failure): GPU forces and energy of replica 0 at step 0 against a CPU
// reference (relative error < 1e-9); a 500-step NVE segment (thermostat off) conserves total
// energy (|dE| < 1e-4 of the potential energy) for every replica; energies finite and
// instantaneous temperatures within 40 % of the target at every exchange point. Output: per
// temperature the replica there and its final potential energy (%.6e), the acceptance count
// per neighbour pair; "time:" lines hold the timings and device names.
//
// Usage: remd [--steps N] [--replicas R]   (defaults 10000, 16; N a multiple of 1000 is best)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CUDA_CHECK(call)                                                                      \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

constexpr int kAtoms = 256;              // 4 * 4^3 (FCC, 4 cells a side); also the block size
constexpr double kEps = 0.9661;          // kJ/mol
constexpr double kSigma = 0.3405;        // nm
constexpr double kMass = 39.948;         // u
constexpr double kBoltz = 0.0083144626;  // kJ/mol/K
constexpr double kRhoStar = 0.8;         // reduced density
constexpr double kDt = 0.005;            // ps
constexpr double kTau = 0.5;             // ps, thermostat coupling
constexpr int kExchangeEvery = 1000;
constexpr int kNveSteps = 500;

struct Params {
  double box, rc2, shift;  // box edge, cut-off squared, U(rc)
};

// Force on atom i and half its pair energies, from all j in a fixed order.
__host__ __device__ inline void lj_atom(const double* x, const double* y, const double* z, int i, Params p,
                                        double* f, double* e) {
  double fx = 0, fy = 0, fz = 0, ei = 0, s2 = kSigma * kSigma;
  for (int j = 0; j < kAtoms; ++j) {
    if (j == i) continue;
    double dx = x[i] - x[j], dy = y[i] - y[j], dz = z[i] - z[j];
    dx -= p.box * rint(dx / p.box);
    dy -= p.box * rint(dy / p.box);
    dz -= p.box * rint(dz / p.box);
    double r2 = dx * dx + dy * dy + dz * dz;
    if (r2 >= p.rc2) continue;
    double sr2 = s2 / r2, sr6 = sr2 * sr2 * sr2;
    double fr = 24.0 * kEps * sr6 * (2.0 * sr6 - 1.0) / r2;
    fx += fr * dx, fy += fr * dy, fz += fr * dz;
    ei += 0.5 * (4.0 * kEps * sr6 * (sr6 - 1.0) - p.shift);
  }
  f[0] = fx, f[1] = fy, f[2] = fz, *e = ei;
}

// Sum of v over the block, in a fixed tree order (deterministic).
__device__ double block_sum(double* red, double v) {
  int i = threadIdx.x;
  __syncthreads();
  red[i] = v;
  __syncthreads();
  for (int s = kAtoms / 2; s > 0; s >>= 1) {
    if (i < s) red[i] += red[i + s];
    __syncthreads();
  }
  return red[0];
}

// Layout per replica: pos[3][kAtoms], vel[3][kAtoms], frc[3][kAtoms]; one block per replica.
__global__ void lj_forces(const double* pos, double* frc, double* pe, Params p) {
  __shared__ double red[kAtoms];
  int r = blockIdx.x, i = threadIdx.x;
  const double* x = pos + (size_t)r * 3 * kAtoms;
  double f[3], e;
  lj_atom(x, x + kAtoms, x + 2 * kAtoms, i, p, f, &e);
  for (int c = 0; c < 3; ++c) frc[(size_t)r * 3 * kAtoms + c * kAtoms + i] = f[c];
  double total = block_sum(red, e);
  if (i == 0) pe[r] = total;
}

// One velocity Verlet step for each replica of the device; thermostat when target[r] > 0.
// energies[2r] = potential, energies[2r+1] = kinetic after the step.
__global__ void md_step(double* pos, double* vel, double* frc, double* energies, const double* target, Params p,
                        int thermostat) {
  __shared__ double sx[kAtoms], sy[kAtoms], sz[kAtoms], red[kAtoms];
  int r = blockIdx.x, i = threadIdx.x;
  double* x = pos + (size_t)r * 3 * kAtoms;
  double* v = vel + (size_t)r * 3 * kAtoms;
  double* f = frc + (size_t)r * 3 * kAtoms;
  double xi[3], vi[3], fi[3], e;
  for (int c = 0; c < 3; ++c) {
    vi[c] = v[c * kAtoms + i] + 0.5 * kDt * f[c * kAtoms + i] / kMass;
    xi[c] = x[c * kAtoms + i] + kDt * vi[c];
    xi[c] -= p.box * floor(xi[c] / p.box);
  }
  sx[i] = xi[0], sy[i] = xi[1], sz[i] = xi[2];
  __syncthreads();
  lj_atom(sx, sy, sz, i, p, fi, &e);
  for (int c = 0; c < 3; ++c) vi[c] += 0.5 * kDt * fi[c] / kMass;
  double ke = block_sum(red, 0.5 * kMass * (vi[0] * vi[0] + vi[1] * vi[1] + vi[2] * vi[2]));
  double pe = block_sum(red, e);
  if (thermostat) {
    double t = 2.0 * ke / ((3.0 * kAtoms - 3.0) * kBoltz);
    double lambda = sqrt(1.0 + kDt / kTau * (target[r] / t - 1.0));
    lambda = fmin(fmax(lambda, 0.9), 1.1);
    for (int c = 0; c < 3; ++c) vi[c] *= lambda;
    ke *= lambda * lambda;
  }
  for (int c = 0; c < 3; ++c) {
    x[c * kAtoms + i] = xi[c];
    v[c * kAtoms + i] = vi[c];
    f[c * kAtoms + i] = fi[c];
  }
  if (i == 0) energies[2 * r] = pe, energies[2 * r + 1] = ke;
}

__global__ void scale_velocities(double* vel, const double* scale) {
  for (int c = 0; c < 3; ++c) vel[(size_t)blockIdx.x * 3 * kAtoms + c * kAtoms + threadIdx.x] *= scale[blockIdx.x];
}

// splitmix64: the host's one random stream.
static unsigned long long g_rng = 0x5EED2024ULL;
static double uniform() {
  unsigned long long z = (g_rng += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}
static double gaussian() {
  double u1 = uniform(), u2 = uniform();
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
}

struct Device {
  cudaStream_t stream;
  std::vector<int> replicas;  // global replica ids, in local (block) order
  double *pos, *vel, *frc, *energies, *target, *scale;
  std::vector<double> host_energies;
};

int main(int argc, char** argv) {
  int steps = 10000, nrep = 16;
  for (int a = 1; a < argc; ++a) {
    if (!std::strcmp(argv[a], "--steps") && a + 1 < argc) steps = std::atoi(argv[++a]);
    else if (!std::strcmp(argv[a], "--replicas") && a + 1 < argc) nrep = std::atoi(argv[++a]);
    else if (!std::strcmp(argv[a], "--atoms") && a + 1 < argc && std::atoi(argv[++a]) == kAtoms) continue;
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--replicas R] [--atoms 256]\n", argv[0]);
      return 2;
    }
  }
  if (steps < 0 || nrep < 2) {
    std::fprintf(stderr, "remd: need steps >= 0 and at least 2 replicas\n");
    return 2;
  }
  const double box = std::cbrt(kAtoms / kRhoStar) * kSigma, rc = 3.0 * kSigma;
  const double src6 = std::pow(kSigma / rc, 6);
  const Params p{box, rc * rc, 4.0 * kEps * src6 * (src6 - 1.0)};
  const double ndf = 3.0 * kAtoms - 3.0;
  std::vector<double> temps(nrep);  // the ladder, by slot
  for (int s = 0; s < nrep; ++s) temps[s] = 80.0 * std::pow(2.0, (double)s / (nrep - 1));
  std::vector<int> slot_of(nrep), rep_at(nrep);  // replica -> temperature slot and back
  for (int r = 0; r < nrep; ++r) slot_of[r] = rep_at[r] = r;

  // Initial states on the host: FCC plus up to 0.05 sigma of displacement, Maxwell velocities.
  std::vector<std::vector<double>> pos0(nrep, std::vector<double>(3 * kAtoms)), vel0 = pos0;
  const double cell = box / 4, basis[4][3] = {{0, 0, 0}, {0.5, 0.5, 0}, {0.5, 0, 0.5}, {0, 0.5, 0.5}};
  for (int r = 0; r < nrep; ++r) {
    for (int a = 0; a < kAtoms; ++a) {
      int b = a % 4, c = a / 4, idx[3] = {c % 4, (c / 4) % 4, c / 16};
      for (int d = 0; d < 3; ++d)
        pos0[r][d * kAtoms + a] = (idx[d] + basis[b][d]) * cell + 0.05 * kSigma * (2 * uniform() - 1);
    }
    double mom[3] = {0, 0, 0}, ke = 0;
    for (int a = 0; a < kAtoms; ++a)
      for (int d = 0; d < 3; ++d) mom[d] += vel0[r][d * kAtoms + a] = gaussian() * std::sqrt(kBoltz * temps[r] / kMass);
    for (int a = 0; a < kAtoms; ++a)
      for (int d = 0; d < 3; ++d) {
        double& v = vel0[r][d * kAtoms + a];
        v -= mom[d] / kAtoms;
        ke += 0.5 * kMass * v * v;
      }
    double scale = std::sqrt(temps[r] / (2.0 * ke / (ndf * kBoltz)));
    for (double& v : vel0[r]) v *= scale;
  }

  int ndev = 0;
  CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (ndev > nrep) ndev = nrep;
  std::vector<Device> devs(ndev);
  size_t per = 3 * kAtoms * sizeof(double);
  for (int d = 0; d < ndev; ++d) {
    Device& D = devs[d];
    for (int r = d; r < nrep; r += ndev) D.replicas.push_back(r);
    size_t n = D.replicas.size();
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    std::printf("time: device %d %s: %zu replica(s)\n", d, prop.name, n);
    CUDA_CHECK(cudaSetDevice(d));
    CUDA_CHECK(cudaStreamCreate(&D.stream));
    for (double** m : {&D.pos, &D.vel, &D.frc}) CUDA_CHECK(cudaMalloc(m, n * per));
    CUDA_CHECK(cudaMalloc(&D.energies, 2 * n * sizeof(double)));
    for (double** m : {&D.target, &D.scale}) CUDA_CHECK(cudaMalloc(m, n * sizeof(double)));
    D.host_energies.assign(2 * n, 0.0);
    for (size_t l = 0; l < n; ++l) {
      CUDA_CHECK(cudaMemcpy(D.pos + l * 3 * kAtoms, pos0[D.replicas[l]].data(), per, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(D.vel + l * 3 * kAtoms, vel0[D.replicas[l]].data(), per, cudaMemcpyHostToDevice));
    }
    lj_forces<<<(unsigned)n, kAtoms, 0, D.stream>>>(D.pos, D.frc, D.energies, p);
    CUDA_CHECK(cudaGetLastError());
  }
  int failed = 0;

  // Check 1: replica 0 (device 0, block 0) against the CPU.
  {
    std::vector<double> gpu_f(3 * kAtoms), cpu_f(3 * kAtoms);
    double gpu_pe = 0, cpu_pe = 0, err = 0, fmax = 0;
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaStreamSynchronize(devs[0].stream));
    CUDA_CHECK(cudaMemcpy(gpu_f.data(), devs[0].frc, per, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&gpu_pe, devs[0].energies, sizeof(double), cudaMemcpyDeviceToHost));
    const double* x = pos0[0].data();
    for (int i = 0; i < kAtoms; ++i) {
      double f[3], e;
      lj_atom(x, x + kAtoms, x + 2 * kAtoms, i, p, f, &e);
      cpu_pe += e;
      for (int c = 0; c < 3; ++c) {
        err = std::fmax(err, std::fabs(f[c] - gpu_f[c * kAtoms + i]));
        fmax = std::fmax(fmax, std::fabs(f[c]));
      }
    }
    bool ok = err <= 1e-9 * fmax && std::fabs(gpu_pe - cpu_pe) <= 1e-9 * std::fabs(cpu_pe);
    std::printf("check: replica 0 step 0 forces and energy match the CPU (relative 1e-9): %s\n", ok ? "yes" : "NO");
    std::printf("remd: replica 0 initial potential energy %.6e kJ/mol\n", cpu_pe);
    failed |= !ok;
  }

  // `n` steps on every device (launches only), then the energies read back: the only sync.
  auto run_on_devices = [&](int n, int thermostat) {
    for (int s = 0; s < n; ++s)
      for (int d = 0; d < ndev; ++d) {
        if (ndev > 1) CUDA_CHECK(cudaSetDevice(d));
        Device& D = devs[d];
        md_step<<<(unsigned)D.replicas.size(), kAtoms, 0, D.stream>>>(D.pos, D.vel, D.frc, D.energies, D.target, p,
                                                                      thermostat);
      }
    for (int d = 0; d < ndev; ++d) {
      CUDA_CHECK(cudaSetDevice(d));
      CUDA_CHECK(cudaGetLastError());
      CUDA_CHECK(cudaMemcpyAsync(devs[d].host_energies.data(), devs[d].energies,
                                 2 * devs[d].replicas.size() * sizeof(double), cudaMemcpyDeviceToHost, devs[d].stream));
    }
    for (int d = 0; d < ndev; ++d) {
      CUDA_CHECK(cudaSetDevice(d));
      CUDA_CHECK(cudaStreamSynchronize(devs[d].stream));
    }
  };
  auto energy_of = [&](int r, int which) {  // 0 potential, 1 kinetic, as of the last read
    return devs[r % ndev].host_energies[2 * (r / ndev) + which];
  };
  auto upload_targets = [&]() {
    for (int d = 0; d < ndev; ++d) {
      CUDA_CHECK(cudaSetDevice(d));
      std::vector<double> t;
      for (int r : devs[d].replicas) t.push_back(temps[slot_of[r]]);
      CUDA_CHECK(cudaMemcpyAsync(devs[d].target, t.data(), t.size() * sizeof(double), cudaMemcpyHostToDevice,
                                 devs[d].stream));
      CUDA_CHECK(cudaStreamSynchronize(devs[d].stream));  // t is on the stack
    }
  };
  upload_targets();

  // Check 2: NVE segment, total energy conserved.
  {
    std::vector<double> e0(nrep);
    for (int r = 0; r < nrep; ++r) {
      double ke = 0;
      for (double v : vel0[r]) ke += 0.5 * kMass * v * v;
      double pe = 0;
      const double* x = pos0[r].data();
      for (int i = 0; i < kAtoms; ++i) {
        double f[3], e;
        lj_atom(x, x + kAtoms, x + 2 * kAtoms, i, p, f, &e);
        pe += e;
      }
      e0[r] = pe + ke;
    }
    run_on_devices(kNveSteps, 0);
    double worst = 0;
    bool ok = true;
    for (int r = 0; r < nrep; ++r) {
      double pe = energy_of(r, 0), e1 = pe + energy_of(r, 1), rel = std::fabs(e1 - e0[r]) / std::fabs(pe);
      worst = std::fmax(worst, rel);
      ok = ok && std::isfinite(e1) && rel < 1e-4;
    }
    std::printf("check: NVE segment of %d steps conserves energy (|dE| < 1e-4 |U|) in every replica: %s\n",
                kNveSteps, ok ? "yes" : "NO");
    std::printf("time: NVE worst relative drift %.3e\n", worst);
    failed |= !ok;
  }

  // REMD.
  std::vector<int> accepted(nrep - 1, 0), attempted(nrep - 1, 0);
  bool in_range = true;
  int round = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int done = 0; done < steps;) {
    int n = std::min(kExchangeEvery, steps - done);
    run_on_devices(n, 1);
    done += n;
    for (int r = 0; r < nrep; ++r) {
      double pe = energy_of(r, 0), t = 2.0 * energy_of(r, 1) / (ndf * kBoltz), want = temps[slot_of[r]];
      if (!std::isfinite(pe) || !(std::fabs(t - want) <= 0.4 * want)) {
        if (in_range) std::fprintf(stderr, "replica %d: U %g, T %g K, target %g K\n", r, pe, t, want);
        in_range = false;
      }
    }
    if (n < kExchangeEvery) break;
    std::vector<double> scale(nrep, 1.0);
    for (int s = round % 2; s + 1 < nrep; s += 2) {
      int a = rep_at[s], b = rep_at[s + 1];
      double delta = (1.0 / (kBoltz * temps[s]) - 1.0 / (kBoltz * temps[s + 1])) * (energy_of(a, 0) - energy_of(b, 0));
      double u = uniform();
      ++attempted[s];
      if (delta >= 0 || u < std::exp(delta)) {
        ++accepted[s];
        std::swap(rep_at[s], rep_at[s + 1]);
        slot_of[a] = s + 1;
        slot_of[b] = s;
        scale[a] = std::sqrt(temps[s + 1] / temps[s]);
        scale[b] = std::sqrt(temps[s] / temps[s + 1]);
      }
    }
    ++round;
    for (int d = 0; d < ndev; ++d) {
      CUDA_CHECK(cudaSetDevice(d));
      std::vector<double> sc;
      for (int r : devs[d].replicas) sc.push_back(scale[r]);
      CUDA_CHECK(cudaMemcpyAsync(devs[d].scale, sc.data(), sc.size() * sizeof(double), cudaMemcpyHostToDevice,
                                 devs[d].stream));
      scale_velocities<<<(unsigned)sc.size(), kAtoms, 0, devs[d].stream>>>(devs[d].vel, devs[d].scale);
      CUDA_CHECK(cudaGetLastError());
      CUDA_CHECK(cudaStreamSynchronize(devs[d].stream));
    }
    upload_targets();
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("remd: argon LJ, %d replicas x %d atoms, rho* %.2f (box %.4f nm), cut-off 3 sigma, dt %.3f ps, %d steps\n",
              nrep, kAtoms, kRhoStar, box, kDt, steps);
  for (int s = 0; s < nrep; ++s)
    std::printf("remd: T %7.3f K: replica %2d, potential energy %.6e kJ/mol\n", temps[s], rep_at[s],
                energy_of(rep_at[s], 0));
  for (int s = 0; s + 1 < nrep; ++s)
    std::printf("remd: exchange %7.3f K <-> %7.3f K: %d of %d accepted\n", temps[s], temps[s + 1], accepted[s],
                attempted[s]);
  std::printf("check: energies finite and temperatures within 40%% of target at every exchange point: %s\n",
              in_range ? "yes" : "NO");
  failed |= !in_range;
  std::printf("time: %.3f s for %d steps (%.1f us/step, %d device(s))\n", secs, steps,
              steps ? 1e6 * secs / steps : 0.0, ndev);
  for (int d = 0; d < ndev; ++d) {
    CUDA_CHECK(cudaSetDevice(d));
    Device& D = devs[d];
    for (double* m : {D.pos, D.vel, D.frc, D.energies, D.target, D.scale}) CUDA_CHECK(cudaFree(m));
    CUDA_CHECK(cudaStreamDestroy(D.stream));
  }
  std::puts(failed ? "remd: FAILED" : "remd: OK");
  return failed ? 1 : 0;
}
