// Stream capture and graphs, on the client. A capture records each call made on its stream
// (launches, copies, fills, host functions) as a node that makes the call again; nothing is
// sent. An event recorded and waited on within the capture adds no node, as in CUDA. Launching
// a graph makes its nodes' calls, in order, on the launch stream, as ordinary asynchronous
// commands: a kernel's arguments are the values captured, and a copy reads or writes host
// memory as that call would when made (small and staged copies read it at the launch). One
// stream per capture: a second stream joining it (an event recorded in the capture waited on
// elsewhere) and stream-ordered allocation in a capture are refused, invalidating the capture,
// as CUDA refuses what it cannot capture. Graphs are built by capture only (no
// cudaGraphAdd*Node); node handles serve cudaStreamGetCaptureInfo and cudaGraphGetNodes.
#include <algorithm>

#include "frontend.h"

namespace tandem::cuda {

Capture* CaptureOf(cudaStream_t stream) {
  Frontend& f = Frontend::Get();
  if (f.capturing.load(std::memory_order_acquire) == 0) return nullptr;
  auto it = f.captures.find(stream);
  return it == f.captures.end() ? nullptr : &it->second;
}

cudaError_t Record(Capture& c, std::string kind, GraphOp op) {
  if (c.invalidated) return cudaErrorStreamCaptureInvalidated;
  c.graph->nodes.push_back(std::make_unique<GraphNode>(GraphNode{.kind = std::move(kind), .op = std::move(op)}));
  return cudaSuccess;
}

cudaError_t Refuse(Capture& c, const std::string& what) {
  log::Once(what + " during stream capture");
  return Invalidate(c);
}

cudaError_t Invalidate(Capture& c) {
  c.invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

namespace {

// Ends a capture; its graph goes too unless `keep_graph`. The next capture.
std::map<const void*, Capture>::iterator EndCapture(std::map<const void*, Capture>::iterator it, bool keep_graph) {
  Frontend& f = Frontend::Get();
  if (!keep_graph) f.graphs.erase(it->second.graph);
  f.capturing.fetch_sub(1, std::memory_order_acq_rel);
  return f.captures.erase(it);
}

}  // namespace

void DropCapture(cudaStream_t stream) {
  Frontend& f = Frontend::Get();
  if (auto it = f.captures.find(stream); it != f.captures.end()) EndCapture(it, false);
}

void DropCaptures(int device) {
  Frontend& f = Frontend::Get();
  for (auto it = f.captures.begin(); it != f.captures.end();) {
    auto s = f.streams.find(it->first);
    const bool other_device = s != f.streams.end() && s->second->device != device;
    it = other_device ? std::next(it) : EndCapture(it, false);
  }
}

Capture* CaptureById(unsigned long long id) {
  for (auto& [stream, c] : Frontend::Get().captures)
    if (c.id == id) return &c;
  return nullptr;
}

std::optional<cudaError_t> Captured(cudaStream_t stream, std::string kind, GraphOp op) {
  Frontend& f = Frontend::Get();
  if (f.capturing.load(std::memory_order_acquire) == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(f.mu);
  Capture* c = CaptureOf(stream);
  if (!c) return std::nullopt;
  return op ? Record(*c, std::move(kind), std::move(op)) : Invalidate(*c);
}

namespace {

GraphExec* FindExec(cudaGraphExec_t exec) {
  auto& execs = Frontend::Get().graph_execs;
  auto it = execs.find(exec);
  return it == execs.end() ? nullptr : it->second.get();
}

Graph* FindGraph(cudaGraph_t graph) {
  auto& graphs = Frontend::Get().graphs;
  auto it = graphs.find(graph);
  return it == graphs.end() ? nullptr : it->second.get();
}

// A graph's nodes as an instantiation keeps them (the graph may be destroyed or captured into
// again afterwards).
std::shared_ptr<const std::vector<GraphNode>> Snapshot(const Graph& g) {
  auto nodes = std::make_shared<std::vector<GraphNode>>();
  nodes->reserve(g.nodes.size());
  for (const auto& n : g.nodes) nodes->push_back(*n);
  return nodes;
}

cudaError_t RunNodes(const std::vector<GraphNode>& nodes, cudaStream_t stream) {
  for (const GraphNode& n : nodes) TANDEM_RETURN_CUDA_IF_ERROR(n.op(stream));
  return cudaSuccess;
}

}  // namespace
}  // namespace tandem::cuda

using namespace tandem;
using namespace tandem::cuda;

TANDEM_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  StreamRef s;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &d, &s)));
  if (stream == nullptr || stream == cudaStreamLegacy) return Return(cudaErrorStreamCaptureUnsupported);
  if (stream == cudaStreamPerThread) {
    log::Once("stream capture on the per-thread default stream (Tandem runs it as the legacy one)");
    return Return(cudaErrorStreamCaptureUnsupported);
  }
  if (f.captures.contains(stream)) return Return(cudaErrorIllegalState);
  auto graph = std::make_unique<Graph>();
  Capture c{.id = f.next_capture_id++, .mode = mode, .thread = std::this_thread::get_id(), .graph = graph.get()};
  f.graphs.emplace(graph.get(), std::move(graph));
  f.captures.emplace(stream, std::move(c));
  f.capturing.fetch_add(1, std::memory_order_acq_rel);
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (!graph) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.captures.find(stream);
  if (it == f.captures.end()) return Return(cudaErrorIllegalState);
  Capture& c = it->second;
  if (c.mode != cudaStreamCaptureModeRelaxed && c.thread != std::this_thread::get_id())
    return Return(cudaErrorStreamCaptureWrongThread);
  const bool invalidated = c.invalidated;
  Graph* g = c.graph;
  EndCapture(it, !invalidated);
  *graph = invalidated ? nullptr : reinterpret_cast<cudaGraph_t>(g);
  return invalidated ? Return(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
}

TANDEM_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (!status) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  StreamRef s;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(ResolveStream(stream, &s)));
  const Capture* c = CaptureOf(stream);
  *status = !c ? cudaStreamCaptureStatusNone
               : c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

// During a capture: its id, its graph so far, and what the next node depends on (the last node
// captured: one stream's nodes form a chain; no edge data). Outside one only the status is
// defined, as in CUDA.
TANDEM_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                                unsigned long long* id, cudaGraph_t* graph,
                                                const cudaGraphNode_t** dependencies, const cudaGraphEdgeData** edge_data,
                                                size_t* count) {
  if (!status) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  StreamRef s;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(ResolveStream(stream, &s)));
  Capture* c = CaptureOf(stream);
  if (!c) {
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  *status = c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  if (id) *id = c->id;
  if (graph) *graph = reinterpret_cast<cudaGraph_t>(c->graph);
  c->dependencies.clear();
  if (!c->graph->nodes.empty()) c->dependencies.push_back(reinterpret_cast<cudaGraphNode_t>(c->graph->nodes.back().get()));
  if (dependencies) *dependencies = c->dependencies.empty() ? nullptr : c->dependencies.data();
  if (edge_data) *edge_data = nullptr;
  if (count) *count = c->dependencies.size();
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  if (!exec) return Return(cudaErrorInvalidValue);
  if (flags & cudaGraphInstantiateFlagDeviceLaunch) return Unsupported("cudaGraphInstantiate for launches from the device");
  // Free-on-launch concerns memory nodes (there are none); upload and node priorities change
  // nothing here.
  if (flags & ~static_cast<unsigned long long>(cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload |
                                                cudaGraphInstantiateFlagUseNodePriority))
    return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  const Graph* g = FindGraph(graph);
  if (!g) return Return(cudaErrorInvalidValue);
  auto e = std::make_unique<GraphExec>(GraphExec{.nodes = Snapshot(*g)});
  *exec = reinterpret_cast<cudaGraphExec_t>(e.get());
  f.graph_execs.emplace(e.get(), std::move(e));
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  return cudaGraphInstantiate(exec, graph, flags);
}

// The instantiation takes the graph's nodes when both have the same shape: as many nodes, of
// the same kinds in the same order (a kernel may change its function, not whether it is
// cooperative, as in CUDA).
TANDEM_API cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo* info) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  GraphExec* e = FindExec(exec);
  const Graph* g = FindGraph(graph);
  if (!e || !g) return Return(cudaErrorInvalidValue);
  cudaGraphExecUpdateResult result = cudaGraphExecUpdateSuccess;
  cudaGraphNode_t error_node = nullptr;
  if (e->nodes->size() != g->nodes.size()) {
    result = cudaGraphExecUpdateErrorTopologyChanged;
  } else {
    for (size_t i = 0; i < g->nodes.size(); ++i) {
      const std::string& was = (*e->nodes)[i].kind;
      const std::string& now = g->nodes[i]->kind;
      if (was == now) continue;
      const bool kernels = was.starts_with("kernel") && now.starts_with("kernel");
      result = kernels ? cudaGraphExecUpdateErrorUnsupportedFunctionChange : cudaGraphExecUpdateErrorNodeTypeChanged;
      error_node = reinterpret_cast<cudaGraphNode_t>(g->nodes[i].get());
      break;
    }
  }
  if (info) *info = cudaGraphExecUpdateResultInfo{.result = result, .errorNode = error_node, .errorFromNode = nullptr};
  if (result != cudaGraphExecUpdateSuccess) return Return(cudaErrorGraphExecUpdateFailure);
  e->nodes = Snapshot(*g);
  return cudaSuccess;
}

// Ordered behind the exec's previous launch, as CUDA orders them: on the same stream that is
// given; on another stream of the same device the stream waits for the event recorded after
// it; on another device's stream this thread waits for that event.
TANDEM_API cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  Frontend& f = Frontend::Get();
  std::shared_ptr<const std::vector<GraphNode>> nodes;
  int device = 0;
  cudaEvent_t done = nullptr;
  int done_device = -1;
  bool wait_stream = false, wait_event = false;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    GraphExec* e = FindExec(exec);
    if (!e) return Return(cudaErrorInvalidValue);
    DeviceContext* d = nullptr;
    StreamRef s;
    TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &d, &s)));
    // Into a capturing stream: refused natively (driver 580, the CUDA suite's graphs), which
    // invalidates the capture as any refusal does.
    if (Capture* c = CaptureOf(stream)) return Return(Invalidate(*c));
    nodes = e->nodes;
    device = d->index;
    done = e->done;
    done_device = e->done_device;
    const bool elsewhere = e->launched && e->last_stream != stream;
    wait_event = elsewhere && done_device == device;
    wait_stream = elsewhere && !wait_event;
  }
  if (wait_event) TANDEM_RETURN_CUDA_IF_ERROR(cudaStreamWaitEvent(stream, done, 0));
  if (wait_stream) TANDEM_RETURN_CUDA_IF_ERROR(cudaEventSynchronize(done));
  TANDEM_RETURN_CUDA_IF_ERROR(Return(RunNodes(*nodes, stream)));
  // The event after this launch, on its stream's device (made there, the current device kept).
  if (!done || done_device != device) {
    int current = 0;
    TANDEM_RETURN_CUDA_IF_ERROR(cudaGetDevice(&current));
    TANDEM_RETURN_CUDA_IF_ERROR(cudaSetDevice(device));
    cudaEvent_t made = nullptr;
    const cudaError_t made_ok = cudaEventCreateWithFlags(&made, cudaEventDisableTiming);
    TANDEM_RETURN_CUDA_IF_ERROR(cudaSetDevice(current));
    TANDEM_RETURN_CUDA_IF_ERROR(made_ok);
    if (done) cudaEventDestroy(done);
    done = made;
  }
  TANDEM_RETURN_CUDA_IF_ERROR(cudaEventRecord(done, stream));
  std::lock_guard<std::mutex> lock(f.mu);
  if (GraphExec* e = FindExec(exec)) {
    e->done = done;
    e->done_device = device;
    e->last_stream = stream;
    e->launched = true;
  } else {
    cudaEventDestroy(done);  // destroyed meanwhile by another thread: nothing to order behind
  }
  return cudaSuccess;
}

// Nothing to upload ahead: the nodes' commands are made at launch.
TANDEM_API cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t stream) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  StreamRef s;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(ResolveStream(stream, &s)));
  return FindExec(exec) ? cudaSuccess : Return(cudaErrorInvalidValue);
}

TANDEM_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Frontend& f = Frontend::Get();
  cudaEvent_t done = nullptr;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    auto it = f.graph_execs.find(exec);
    if (it == f.graph_execs.end()) return Return(cudaErrorInvalidValue);
    done = it->second->done;
    f.graph_execs.erase(it);
  }
  if (done) cudaEventDestroy(done);
  return cudaSuccess;
}

// A graph still being captured is not the program's to destroy.
TANDEM_API cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  for (const auto& [stream, c] : f.captures)
    if (c.graph == reinterpret_cast<Graph*>(graph)) return Return(cudaErrorInvalidValue);
  return f.graphs.erase(graph) ? cudaSuccess : Return(cudaErrorInvalidValue);
}

// The number of nodes, or their handles (as many as fit in *count, which then says how many).
TANDEM_API cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  if (!count) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  const Graph* g = FindGraph(graph);
  if (!g) return Return(cudaErrorInvalidValue);
  if (!nodes) {
    *count = g->nodes.size();
    return cudaSuccess;
  }
  const size_t n = std::min(*count, g->nodes.size());
  for (size_t i = 0; i < n; ++i) nodes[i] = reinterpret_cast<cudaGraphNode_t>(g->nodes[i].get());
  for (size_t i = n; i < *count; ++i) nodes[i] = nullptr;
  *count = n;
  return cudaSuccess;
}
