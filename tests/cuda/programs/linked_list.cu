// Pointers stored inside device memory stay valid: a linked list built by the host out of
// device addresses, then walked by a kernel. Also cudaMemcpyDefault in every direction.
#include <cstdio>
#include <vector>

#include "check.h"

struct Node {
  int value;
  Node* next;
};

__global__ void walk(const Node* head, int* sum, int* count) {
  int s = 0, c = 0;
  for (const Node* n = head; n; n = n->next) {
    s += n->value;
    ++c;
  }
  *sum = s;
  *count = c;
}

int main() {
  const int n = 50;
  // Each node in its own allocation, so the pointers cross allocations.
  std::vector<Node*> nodes(n);
  for (int i = 0; i < n; ++i) CHECK(cudaMalloc(&nodes[i], sizeof(Node)));
  for (int i = 0; i < n; ++i) {
    Node h{i + 1, i + 1 < n ? nodes[i + 1] : nullptr};
    CHECK(cudaMemcpy(nodes[i], &h, sizeof h, cudaMemcpyDefault));
  }
  int *sum, *count;
  CHECK(cudaMalloc(&sum, sizeof(int)));
  CHECK(cudaMalloc(&count, sizeof(int)));
  walk<<<1, 1>>>(nodes[0], sum, count);
  CHECK(cudaGetLastError());
  int s = 0, c = 0;
  CHECK(cudaMemcpy(&s, sum, sizeof s, cudaMemcpyDefault));
  CHECK(cudaMemcpy(&c, count, sizeof c, cudaMemcpyDefault));
  printf("list of %d nodes sums to %d\n", c, s);
  // Device to device by address, then read one node back.
  CHECK(cudaMemcpy(nodes[0], nodes[n - 1], sizeof(Node), cudaMemcpyDefault));
  Node back{};
  CHECK(cudaMemcpy(&back, nodes[0], sizeof back, cudaMemcpyDefault));
  printf("node 0 after device copy: value %d, next %s\n", back.value, back.next ? "set" : "null");
  for (Node* p : nodes) CHECK(cudaFree(p));
  CHECK(cudaFree(sum));
  CHECK(cudaFree(count));
  return s == n * (n + 1) / 2 && c == n && back.value == n ? 0 : 1;
}
