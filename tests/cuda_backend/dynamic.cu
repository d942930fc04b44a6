// Dynamic parallelism (-rdc=true): the image a program built this way registers is the
// device-linked fatbinary (nvcc -dlink -fatbin), cudadevrt already inside.
extern "C" __global__ void child(int* p, int base) { p[threadIdx.x] = base + threadIdx.x; }
extern "C" __global__ void parent(int* p) {
  if (threadIdx.x == 0) child<<<1, 8>>>(p, 100);
}
