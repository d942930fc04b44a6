// Keepalive (ir Warm): a small write and read back and/or an empty kernel on a queue of its
// own, so it never orders against the program's queues.
#include <fmt/format.h>

#include <memory>
#include <vector>

#include "opencl_backend.h"
#include "tandem/log.h"

namespace tandem::server::opencl {

Status OpenCLBackend::OnWarm(const ir::WarmReq& req, ir::WarmRep* rep) {
  auto dev = DeviceAt(req.device);
  if (!dev.ok()) return dev.status();
  Device& d = *dev.value();
  cl_int err = CL_SUCCESS;
  if (!d.warm_queue) {
    cl_command_queue q = clCreateCommandQueueWithProperties(d.context.get(), d.id, nullptr, &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateCommandQueueWithProperties", "keepalive queue");
    d.warm_queue = std::make_shared<QueueRef>(q);
  }
  if ((req.what & ir::kWarmCopy) && !d.warm_scratch) {
    cl_mem m = clCreateBuffer(d.context.get(), CL_MEM_READ_WRITE, ir::kWarmMaxBytes, nullptr, &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateBuffer", "keepalive scratch");
    d.warm_scratch.reset(m);
  }
  if ((req.what & ir::kWarmKernel) && !d.warm_kernel) {
    const char* source = "__kernel void tandem_warm_empty(void) {}";
    cl_program p = clCreateProgramWithSource(d.context.get(), 1, &source, nullptr, &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateProgramWithSource", "keepalive kernel");
    d.warm_program.reset(p);
    err = clBuildProgram(p, 1, &d.id, "", nullptr, nullptr);
    if (err != CL_SUCCESS) return ClError(err, "clBuildProgram", "keepalive kernel");
    cl_kernel k = clCreateKernel(p, "tandem_warm_empty", &err);
    if (err != CL_SUCCESS) return ClError(err, "clCreateKernel", "keepalive kernel");
    d.warm_kernel.reset(k);
  }
  cl_command_queue q = d.warm_queue->get();
  const size_t n = req.data.size();
  rep->data.clear();
  // The write's source outlives the request: the wait below may run after this returns.
  auto source = std::make_shared<std::vector<uint8_t>>(req.data.begin(), req.data.end());
  // An enqueue that fails after the write went in: the write may still read `source`. A queue
  // that cannot even be finished keeps it for good (64 bytes at most, logged).
  auto failed = [&](cl_int e, const char* call) {
    if (cl_int f = clFinish(q); f != CL_SUCCESS) {
      log::Warn("keepalive: clFinish after a failed {} failed too ({}); its {} bytes stay allocated", call,
                ClErrorName(f), n);
      static auto* kept = new std::vector<std::shared_ptr<std::vector<uint8_t>>>;  // the executor's thread only
      kept->push_back(source);
    }
    return ClError(e, call, "keepalive");
  };
  if ((req.what & ir::kWarmCopy) && n > 0) {
    err = clEnqueueWriteBuffer(q, d.warm_scratch.get(), CL_FALSE, 0, n, source->data(), 0, nullptr, nullptr);
    if (err != CL_SUCCESS) return ClError(err, "clEnqueueWriteBuffer", "keepalive");
  }
  if (req.what & ir::kWarmKernel) {
    const size_t one = 1;
    err = clEnqueueNDRangeKernel(q, d.warm_kernel.get(), 1, nullptr, &one, &one, 0, nullptr, nullptr);
    if (err != CL_SUCCESS) return failed(err, "clEnqueueNDRangeKernel");
  }
  // The wait goes the way of a program's read back and synchronize (ReplyWhenRead,
  // FinishLater): off the executor, on the session's waiter thread, which then sends the
  // reply. That thread is on every such round trip, and one that only the program's commands
  // wake is slow after a gap (the OpenCL idle read-back, H100: 4x its warm latency after
  // 20 ms while the keepalive warmed only the executor's blocking path).
  if (!(req.what & ir::kWarmCopy) || n == 0) return FinishLater({d.warm_queue});
  rep->data.resize(n);
  std::shared_ptr<uint8_t> slot = ReadSlot(static_cast<uint32_t>(req.device));
  cl_event read = nullptr;
  err = clEnqueueReadBuffer(q, d.warm_scratch.get(), CL_FALSE, 0, n, slot ? slot.get() : rep->data.data(), 0,
                            nullptr, &read);
  if (err != CL_SUCCESS) return failed(err, "clEnqueueReadBuffer");
  clFlush(q);
  // In order on its queue: the read done, the write of `source` is done too.
  return ReplyWhenRead(read, std::move(slot), rep->data.data(), n, "keepalive", std::move(source));
}

}  // namespace tandem::server::opencl
