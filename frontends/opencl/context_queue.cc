// Contexts (a set of remote devices, possibly on several servers) and command queues (one
// IR stream each). Creation posts StreamCreate and returns at once; clFinish is the only
// call here that waits for the server.
#include <algorithm>

#include "objects.h"

namespace tandem::ocl {
namespace {

// Checks context properties and copies them (0-terminated) for CL_CONTEXT_PROPERTIES.
cl_int ParseContextProperties(const cl_context_properties* props, std::vector<cl_context_properties>* out) {
  if (!props) return CL_SUCCESS;
  bool seen_platform = false, seen_sync = false;
  for (const cl_context_properties* p = props; *p; p += 2) {
    switch (p[0]) {
      case CL_CONTEXT_PLATFORM:
        if (seen_platform) return CL_INVALID_PROPERTY;
        seen_platform = true;
        if (reinterpret_cast<cl_platform_id>(p[1]) != ThePlatform()) return CL_INVALID_PLATFORM;
        break;
      case CL_CONTEXT_INTEROP_USER_SYNC:
        if (seen_sync) return CL_INVALID_PROPERTY;
        seen_sync = true;
        break;
      default:
        return CL_INVALID_PROPERTY;
    }
    out->push_back(p[0]);
    out->push_back(p[1]);
  }
  out->push_back(0);
  return CL_SUCCESS;
}

cl_context MakeContext(const cl_context_properties* properties, std::vector<cl_device_id> devices,
                       _cl_context::Notify notify, void* data, cl_int* errcode_ret) {
  auto ctx = std::make_unique<_cl_context>();
  if (cl_int err = ParseContextProperties(properties, &ctx->properties); err != CL_SUCCESS) {
    SetErr(errcode_ret, err);
    return nullptr;
  }
  if (!notify && data) {
    SetErr(errcode_ret, CL_INVALID_VALUE);
    return nullptr;
  }
  for (cl_device_id d : devices) {
    if (!d->session().health().ok()) {
      log::Warn("OpenCL: device {} is not available: {}", d->remote->info.name, d->session().health().ToString());
      SetErr(errcode_ret, CL_DEVICE_NOT_AVAILABLE);
      return nullptr;
    }
  }
  ctx->devices = std::move(devices);
  ctx->notify = notify;
  ctx->notify_data = data;
  SetErr(errcode_ret, CL_SUCCESS);
  return Publish(ctx.release());
}

cl_command_queue MakeQueue(cl_context context, cl_device_id device, cl_command_queue_properties props,
                           std::vector<cl_queue_properties> prop_array, cl_int* errcode_ret) {
  if (!Valid(context)) return SetErr(errcode_ret, CL_INVALID_CONTEXT), nullptr;
  if (!ValidDevice(device) || !context->Has(device)) return SetErr(errcode_ret, CL_INVALID_DEVICE), nullptr;
  if (props & ~cl_command_queue_properties{CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_PROFILING_ENABLE})
    return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  if (props & ~device->queue_props) return SetErr(errcode_ret, CL_INVALID_QUEUE_PROPERTIES), nullptr;
  auto q = std::make_unique<_cl_command_queue>();
  q->context = context;
  q->device = device;
  q->props = props;
  q->prop_array = std::move(prop_array);
  q->stream = client::Runtime::Get().NewHandle();
  NoteQueueStream(q->stream);
  uint32_t flags = 0;
  if (props & CL_QUEUE_PROFILING_ENABLE) flags |= ir::kStreamProfiling;
  if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) flags |= ir::kStreamOutOfOrder;
  device->session().Post(ir::StreamCreateReq{q->stream, device->remote->remote_index, flags, 0});
  context->Hold();
  SetErr(errcode_ret, CL_SUCCESS);
  return Publish(q.release());
}

}  // namespace

cl_context CreateContext(const cl_context_properties* properties, cl_uint num_devices, const cl_device_id* devices,
                         _cl_context::Notify notify, void* data, cl_int* errcode_ret) {
  if (!devices || num_devices == 0) return SetErr(errcode_ret, CL_INVALID_VALUE), nullptr;
  std::vector<cl_device_id> list;
  for (cl_uint i = 0; i < num_devices; ++i) {
    if (!ValidDevice(devices[i])) return SetErr(errcode_ret, CL_INVALID_DEVICE), nullptr;
    if (std::find(list.begin(), list.end(), devices[i]) == list.end()) list.push_back(devices[i]);
  }
  return MakeContext(properties, std::move(list), notify, data, errcode_ret);
}

cl_context CreateContextFromType(const cl_context_properties* properties, cl_device_type type,
                                 _cl_context::Notify notify, void* data, cl_int* errcode_ret) {
  cl_uint n = 0;
  cl_int err = GetDeviceIDs(ThePlatform(), type, 0, nullptr, &n);
  if (err != CL_SUCCESS) return SetErr(errcode_ret, err), nullptr;
  std::vector<cl_device_id> list(n);
  GetDeviceIDs(ThePlatform(), type, n, list.data(), nullptr);
  return MakeContext(properties, std::move(list), notify, data, errcode_ret);
}

cl_int RetainContext(cl_context context) {
  if (!Valid(context)) return CL_INVALID_CONTEXT;
  context->Retain();
  return CL_SUCCESS;
}

cl_int ReleaseContext(cl_context context) {
  if (!Valid(context) || !context->Release()) return CL_INVALID_CONTEXT;
  return CL_SUCCESS;
}

cl_int GetContextInfo(cl_context context, cl_context_info param, size_t size, void* value, size_t* size_ret) {
  if (!Valid(context)) return CL_INVALID_CONTEXT;
  switch (param) {
    case CL_CONTEXT_REFERENCE_COUNT:
      return AnswerValue(size, value, size_ret, context->refs.load());
    case CL_CONTEXT_NUM_DEVICES:
      return AnswerValue(size, value, size_ret, static_cast<cl_uint>(context->devices.size()));
    case CL_CONTEXT_DEVICES:
      return AnswerArray(size, value, size_ret, context->devices);
    case CL_CONTEXT_PROPERTIES:
      return AnswerArray(size, value, size_ret, context->properties);
    default:
      return CL_INVALID_VALUE;
  }
}

// ---- command queues ------------------------------------------------------------------------

cl_command_queue CreateCommandQueue(cl_context context, cl_device_id device, cl_command_queue_properties props,
                                    cl_int* errcode_ret) {
  return MakeQueue(context, device, props, {}, errcode_ret);
}

// Accepted for 1.2 programs built against newer headers: only CL_QUEUE_PROPERTIES.
cl_command_queue CreateCommandQueueWithProperties(cl_context context, cl_device_id device,
                                                  const cl_queue_properties* properties, cl_int* errcode_ret) {
  cl_command_queue_properties props = 0;
  std::vector<cl_queue_properties> array;
  if (properties) {
    for (const cl_queue_properties* p = properties; *p; p += 2) {
      if (p[0] != CL_QUEUE_PROPERTIES) return SetErr(errcode_ret, CL_INVALID_QUEUE_PROPERTIES), nullptr;
      props = p[1];
      array.insert(array.end(), {p[0], p[1]});
    }
    array.push_back(0);
  }
  return MakeQueue(context, device, props, std::move(array), errcode_ret);
}

cl_int RetainCommandQueue(cl_command_queue q) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  q->Retain();
  return CL_SUCCESS;
}

// Releasing a queue flushes it (the spec's implicit clFlush).
cl_int ReleaseCommandQueue(cl_command_queue q) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  q->session().Flush();
  if (!q->Release()) return CL_INVALID_COMMAND_QUEUE;
  return CL_SUCCESS;
}

cl_int GetCommandQueueInfo(cl_command_queue q, cl_command_queue_info param, size_t size, void* value,
                           size_t* size_ret) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  switch (param) {
    case CL_QUEUE_CONTEXT:
      return AnswerValue(size, value, size_ret, q->context);
    case CL_QUEUE_DEVICE:
      return AnswerValue(size, value, size_ret, q->device);
    case CL_QUEUE_REFERENCE_COUNT:
      return AnswerValue(size, value, size_ret, q->refs.load());
    case CL_QUEUE_PROPERTIES:
      return AnswerValue(size, value, size_ret, q->props);
    default:
      return CL_INVALID_VALUE;
  }
}

cl_int Flush(cl_command_queue q) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  client::Session& s = q->session();
  s.Post(ir::StreamFlushReq{q->stream});
  Status st = s.Flush();
  RouteAsyncErrors(s);
  return ToCl(st, "clFlush");
}

// Waits for the stream, then for reads begun before it whose data is still on its way to host
// memory (not for those other threads begin meanwhile: one may wait for a user event that is
// set once this returns); answers a failure of the queue's that no event carried
// (RouteAsyncErrors).
cl_int Finish(cl_command_queue q) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  Held<_cl_command_queue> hold(q);
  const uint64_t reads_before = q->ReadsBegun();
  auto r = CallOn(q->session(), ir::StreamSyncReq{q->stream});
  if (!r.ok()) return ToCl(r.status(), "clFinish");
  q->WaitForReadsBefore(reads_before);
  return TakeUnclaimedFailure(q);
}

}  // namespace tandem::ocl

// ---- object members (the objects live in the global namespace, as cl.h declares them) ----

using namespace tandem::ocl;  // NOLINT: member bodies call the family helpers

bool _cl_context::Has(cl_device_id d) const {
  return std::find(devices.begin(), devices.end(), d) != devices.end();
}

_cl_command_queue::~_cl_command_queue() {
  ForgetQueueStream(stream);
  session().Post(tandem::ir::StreamDestroyReq{stream});
  context->Unhold();
}
