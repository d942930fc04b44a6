// Stream capture and graphs: a captured sequence (kernels with arguments by value, a fill, copies
// device to device, host to device and device to host, a host function, an event record and a
// wait on it) launched several times and into another stream, host memory read when the graph
// runs, nothing running while capturing, cudaGraphExecUpdate with a graph of the same shape
// (other values, another kernel) and refused for another shape, launches of one instantiation
// on two streams, capture status and info, and what a capture refuses (a graph launch, a synchronize of the
// capturing stream, the legacy stream, a capture begun twice or ended without one). Printed as facts, so native and Tandem print the same. (What Tandem refuses
// and CUDA captures, a second stream joining or stream-ordered allocation, is not here.)
#include <cstdio>
#include <cstring>

#include "check.h"

__global__ void axpb(int* v, int n, int a, int b) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = a * v[i] + b;
}

__global__ void axpb_plus_one(int* v, int n, int a, int b) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = a * v[i] + b + 1;
}

__global__ void add(int* dst, const int* src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

static int host_calls = 0;
static void CUDART_CB count_call(void*) { ++host_calls; }

constexpr int n = 1 << 16;

int main() {
  cudaStream_t s, other;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaStreamCreate(&other));
  int *v = nullptr, *w = nullptr, *in = nullptr, *out = nullptr;
  CHECK(cudaMalloc(&v, n * sizeof(int)));
  CHECK(cudaMalloc(&w, n * sizeof(int)));
  CHECK(cudaMallocHost(&in, n * sizeof(int)));
  CHECK(cudaMallocHost(&out, n * sizeof(int)));
  cudaEvent_t ev;
  CHECK(cudaEventCreate(&ev));

  // v = in (host, read when the graph runs); v = 3v + b, with b as it was at capture; w = 0;
  // w += v; out = w; a host call.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CHECK(cudaMemset(v, 0, n * sizeof(int)));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaStreamIsCapturing(s, &status));
  printf("capturing: %d\n", status == cudaStreamCaptureStatusActive);
  int b = 5;
  CHECK(cudaMemcpyAsync(v, in, n * sizeof(int), cudaMemcpyHostToDevice, s));
  axpb<<<n / 256, 256, 0, s>>>(v, n, 3, b);
  b = 1000;  // the node keeps 5
  CHECK(cudaMemsetAsync(w, 0, n * sizeof(int), s));
  CHECK(cudaEventRecord(ev, s));
  CHECK(cudaStreamWaitEvent(s, ev, 0));
  add<<<n / 256, 256, 0, s>>>(w, v, n);
  CHECK(cudaMemcpyAsync(out, w, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaLaunchHostFunc(s, count_call, nullptr));
  unsigned long long id = 0;
  cudaGraph_t in_progress = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t ndeps = 0;
  CHECK(cudaStreamGetCaptureInfo(s, &status, &id, &in_progress, &deps, nullptr, &ndeps));
  printf("capture info: active %d, id set %d, graph set %d, next node depends on %zu\n",
         status == cudaStreamCaptureStatusActive, id != 0, in_progress != nullptr, ndeps);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaStreamIsCapturing(s, &status));
  printf("capturing after the end: %d\n", status != cudaStreamCaptureStatusNone);
  CHECK(cudaMemcpy(out, v, n * sizeof(int), cudaMemcpyDeviceToHost));
  int untouched = 1;
  for (int i = 0; i < n; ++i) untouched &= out[i] == 0;
  printf("nothing ran while capturing: %d\n", untouched);
  size_t nodes = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  printf("nodes: %zu\n", nodes);  // an event recorded and waited on within the capture is no node

  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  int good = 1;
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < n; ++i) in[i] = i + round;
    memset(out, 0, n * sizeof(int));
    CHECK(cudaGraphLaunch(exec, round % 2 ? other : s));  // and into another stream
    CHECK(cudaStreamSynchronize(round % 2 ? other : s));
    for (int i = 0; i < n; ++i) good &= out[i] == 3 * (i + round) + 5;
  }
  printf("four launches right: %d, host calls %d\n", good, host_calls);

  // Same shape, other values: the instantiation takes them.
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpyAsync(v, in, n * sizeof(int), cudaMemcpyHostToDevice, s));
  axpb<<<n / 256, 256, 0, s>>>(v, n, 2, 7);
  CHECK(cudaMemsetAsync(w, 0, n * sizeof(int), s));
  CHECK(cudaEventRecord(ev, s));
  CHECK(cudaStreamWaitEvent(s, ev, 0));
  add<<<n / 256, 256, 0, s>>>(w, v, n);
  CHECK(cudaMemcpyAsync(out, w, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaLaunchHostFunc(s, count_call, nullptr));
  cudaGraph_t same_shape = nullptr;
  CHECK(cudaStreamEndCapture(s, &same_shape));
  cudaGraphExecUpdateResultInfo info{};
  printf("update, same shape: %s\n", cudaGetErrorName(cudaGraphExecUpdate(exec, same_shape, &info)));
  for (int i = 0; i < n; ++i) in[i] = i;
  CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  good = 1;
  for (int i = 0; i < n; ++i) good &= out[i] == 2 * i + 7;
  printf("after the update: right %d, host calls %d\n", good, host_calls);

  // Another shape (one kernel only): refused, the instantiation unchanged.
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  axpb<<<n / 256, 256, 0, s>>>(v, n, 1, 1);
  cudaGraph_t other_shape = nullptr;
  CHECK(cudaStreamEndCapture(s, &other_shape));
  const cudaError_t refused = cudaGraphExecUpdate(exec, other_shape, &info);
  printf("update, another shape: %s, result is not success %d\n", cudaGetErrorName(refused),
         info.result != cudaGraphExecUpdateSuccess);
  cudaGetLastError();

  // Same shape with another kernel in the first kernel's place: allowed, as natively.
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpyAsync(v, in, n * sizeof(int), cudaMemcpyHostToDevice, s));
  axpb_plus_one<<<n / 256, 256, 0, s>>>(v, n, 2, 7);
  CHECK(cudaMemsetAsync(w, 0, n * sizeof(int), s));
  add<<<n / 256, 256, 0, s>>>(w, v, n);
  CHECK(cudaMemcpyAsync(out, w, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaLaunchHostFunc(s, count_call, nullptr));
  cudaGraph_t other_kernel = nullptr;
  CHECK(cudaStreamEndCapture(s, &other_kernel));
  printf("update, another kernel: %s\n", cudaGetErrorName(cudaGraphExecUpdate(exec, other_kernel, &info)));
  cudaGetLastError();
  for (int i = 0; i < n; ++i) in[i] = i;
  CHECK(cudaGraphLaunch(exec, other));
  CHECK(cudaGraphLaunch(exec, s));  // ordered behind the launch on the other stream
  CHECK(cudaStreamSynchronize(s));
  good = 1;
  for (int i = 0; i < n; ++i) good &= out[i] == 2 * i + 8;
  printf("after that update, launched on two streams: right %d, host calls %d\n", good, host_calls);

  // A graph launched into a capturing stream: refused natively.
  CHECK(cudaStreamBeginCapture(other, cudaStreamCaptureModeGlobal));
  printf("graph launched into a capture: %s\n", cudaGetErrorName(cudaGraphLaunch(exec, other)));
  cudaGraph_t outer = nullptr;
  printf("that capture's end: %s\n", cudaGetErrorName(cudaStreamEndCapture(other, &outer)));
  if (outer) CHECK(cudaGraphDestroy(outer));
  cudaGetLastError();

  // What a capture refuses; the capture is invalidated, and its end says so.
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  axpb<<<1, 1, 0, s>>>(v, 1, 1, 0);
  printf("synchronize the capturing stream: %s\n", cudaGetErrorName(cudaStreamSynchronize(s)));
  CHECK(cudaStreamIsCapturing(s, &status));
  printf("invalidated: %d\n", status == cudaStreamCaptureStatusInvalidated);
  cudaGraph_t none = nullptr;
  printf("end of an invalidated capture: %s, graph %d\n", cudaGetErrorName(cudaStreamEndCapture(s, &none)),
         none != nullptr);
  cudaGetLastError();

  printf("capture on the legacy stream: %s\n", cudaGetErrorName(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal)));
  cudaGetLastError();
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  printf("a capture begun twice: %s\n", cudaGetErrorName(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)));
  printf("its end: %s\n", cudaGetErrorName(cudaStreamEndCapture(s, &none)));
  if (none) CHECK(cudaGraphDestroy(none));
  cudaGetLastError();
  printf("end without a capture: %s\n", cudaGetErrorName(cudaStreamEndCapture(s, &none)));
  cudaGetLastError();

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(other_shape));
  CHECK(cudaGraphDestroy(other_kernel));
  CHECK(cudaGraphDestroy(same_shape));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(ev));
  CHECK(cudaFreeHost(in));
  CHECK(cudaFreeHost(out));
  CHECK(cudaFree(v));
  CHECK(cudaFree(w));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(other));
  printf("done\n");
  return 0;
}
