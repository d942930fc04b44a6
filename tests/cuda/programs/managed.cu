// A __managed__ variable: the host's own accesses work; a kernel of the module either runs and
// sees the host's value (natively) or is refused with cudaErrorNotSupported (through Tandem,
// which has no managed memory): never a fault, never a kernel that sees other bytes.
#include <cstdio>

#include "check.h"

__managed__ int counter;

__global__ void bump() { counter += 1; }

int main() {
  counter = 5;  // nvcc: through the pointer __cudaRegisterManagedVar filled in
  printf("host write and read: %d\n", counter);
  bump<<<1, 1>>>();
  cudaError_t launched = cudaGetLastError();
  CHECK(cudaDeviceSynchronize());
  const bool consistent = (launched == cudaSuccess && counter == 6) || (launched == cudaErrorNotSupported && counter == 5);
  printf("the kernel saw the host's value, or was refused: %s\n", consistent ? "yes" : "no");
  return consistent ? 0 : 1;
}
