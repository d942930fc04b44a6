// Which enqueue/wait pattern of the native OpenCL is fastest for a small read back, a write
// and a kernel + finish, on one thread and with the wait on a second (spinning) thread as
// tandemd's waiter does it. Behind ReadSlots (server/backends/opencl/opencl_backend.h): on
// NVIDIA's OpenCL a non-blocking read into pageable memory is 2-6x slower than one into
// mapped CL_MEM_ALLOC_HOST_PTR memory (bench/results/2026-11-24-h100-d.md).
//   gcc -O2 -o /tmp/opencl_read_paths bench/experiments/opencl_read_paths.c -lOpenCL -lpthread
//   OCL_ICD_VENDORS=<dir with nvidia.icd> OCL_ICD_FILENAMES=libnvidia-opencl.so.1 /tmp/opencl_read_paths
// It uses the first platform and device the loader gives.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(const double*)a,y=*(const double*)b;return x<y?-1:x>y;}
static double med(double*v,int n){qsort(v,n,sizeof(double),cmp);return v[n/2];}
static cl_command_queue q; static cl_kernel k; static cl_mem m; static size_t one=1;
// second thread: waits for a job (0 none, 1 clFinish, 2 clWaitForEvents(ev)), runs it, sets done
static _Atomic int job; static _Atomic int done; static cl_event jev;
static void* waiter(void* arg){ (void)arg; for(;;){ int j; while((j=atomic_load(&job))==0) sched_yield();
  if(j==1) clFinish(q); else if(j==2) clWaitForEvents(1,&jev); else if(j==3) return 0;
  atomic_store(&job,0); atomic_store(&done,1);} }
static void handoff(int j){ atomic_store(&done,0); atomic_store(&job,j); while(!atomic_load(&done)) sched_yield(); }
enum{R=2000}; static double t[R];
#define BENCH(name, body) do{ for(int r=0;r<R;r++){ double t0=now(); body; t[r]=now()-t0; } printf("%-52s %6.1f us\n", name, med(t,R)); }while(0)
int main(void){
  cl_platform_id p; cl_device_id d; cl_int err;
  clGetPlatformIDs(1,&p,0); clGetDeviceIDs(p,CL_DEVICE_TYPE_ALL,1,&d,0);
  cl_context c=clCreateContext(0,1,&d,0,0,&err); q=clCreateCommandQueue(c,d,0,&err);
  const char* src="__kernel void empty(void){}";
  cl_program pr=clCreateProgramWithSource(c,1,&src,0,&err); clBuildProgram(pr,1,&d,"",0,0); k=clCreateKernel(pr,"empty",&err);
  m=clCreateBuffer(c,CL_MEM_READ_WRITE,4096,0,&err);
  cl_mem pin=clCreateBuffer(c,CL_MEM_ALLOC_HOST_PTR,4096,0,&err);
  char* pinp=clEnqueueMapBuffer(q,pin,CL_TRUE,CL_MAP_READ|CL_MAP_WRITE,0,4096,0,0,0,&err);
  char h[4096]; pthread_t th; pthread_create(&th,0,waiter,0);
  for(int round=0; round<2; ++round){
  printf("-- round %d\n", round);
  BENCH("kernel + clFinish", {clEnqueueNDRangeKernel(q,k,1,0,&one,0,0,0,0); clFinish(q);});
  BENCH("kernel(event, released) + clFlush + clFinish", {cl_event e; clEnqueueNDRangeKernel(q,k,1,0,&one,0,0,0,&e); clReleaseEvent(e); clFlush(q); clFinish(q);});
  BENCH("kernel + clFlush, clFinish on 2nd thread", {clEnqueueNDRangeKernel(q,k,1,0,&one,0,0,0,0); clFlush(q); handoff(1);});
  BENCH("kernel(event) + clFlush + clWaitForEvents", {cl_event e; clEnqueueNDRangeKernel(q,k,1,0,&one,0,0,0,&e); clFlush(q); clWaitForEvents(1,&e); clReleaseEvent(e);});
  BENCH("read 8B blocking, pageable", {clEnqueueReadBuffer(q,m,CL_TRUE,0,8,h,0,0,0);});
  BENCH("read 8B blocking, pinned", {clEnqueueReadBuffer(q,m,CL_TRUE,0,8,pinp,0,0,0);});
  BENCH("read 8B async pageable + flush + clWaitForEvents", {cl_event e; clEnqueueReadBuffer(q,m,CL_FALSE,0,8,h,0,0,&e); clFlush(q); clWaitForEvents(1,&e); clReleaseEvent(e);});
  BENCH("read 8B async pinned + flush + clWaitForEvents", {cl_event e; clEnqueueReadBuffer(q,m,CL_FALSE,0,8,pinp,0,0,&e); clFlush(q); clWaitForEvents(1,&e); clReleaseEvent(e);});
  BENCH("read 8B async pageable + flush, wait on 2nd thread", {clEnqueueReadBuffer(q,m,CL_FALSE,0,8,h,0,0,&jev); clFlush(q); handoff(2); clReleaseEvent(jev);});
  BENCH("read 8B async pinned + flush, wait on 2nd thread", {clEnqueueReadBuffer(q,m,CL_FALSE,0,8,pinp,0,0,&jev); clFlush(q); handoff(2); clReleaseEvent(jev);});
  BENCH("read 8B async pinned + flush, clFinish on 2nd thread", {clEnqueueReadBuffer(q,m,CL_FALSE,0,8,pinp,0,0,0); clFlush(q); handoff(1);});
  BENCH("write 8B blocking, pageable", {clEnqueueWriteBuffer(q,m,CL_TRUE,0,8,h,0,0,0);});
  BENCH("write 8B async pageable + clFinish", {clEnqueueWriteBuffer(q,m,CL_FALSE,0,8,h,0,0,0); clFinish(q);});
  BENCH("write 8B async pinned + clFinish", {clEnqueueWriteBuffer(q,m,CL_FALSE,0,8,pinp,0,0,0); clFinish(q);});
  BENCH("write 8B async pageable + kernel + clFinish", {clEnqueueWriteBuffer(q,m,CL_FALSE,0,8,h,0,0,0); clEnqueueNDRangeKernel(q,k,1,0,&one,0,0,0,0); clFinish(q);});
  BENCH("write 8B async pinned + kernel + clFinish", {clEnqueueWriteBuffer(q,m,CL_FALSE,0,8,pinp,0,0,0); clEnqueueNDRangeKernel(q,k,1,0,&one,0,0,0,0); clFinish(q);});
  BENCH("write 8B async pageable (event+release) + kernel + clFinish", {cl_event e; clEnqueueWriteBuffer(q,m,CL_FALSE,0,8,h,0,0,&e); clReleaseEvent(e); clEnqueueNDRangeKernel(q,k,1,0,&one,0,0,0,0); clFinish(q);});
  BENCH("write 4KB async pageable + clFinish", {clEnqueueWriteBuffer(q,m,CL_FALSE,0,4096,h,0,0,0); clFinish(q);});
  BENCH("read 4KB blocking, pageable", {clEnqueueReadBuffer(q,m,CL_TRUE,0,4096,h,0,0,0);});
  BENCH("read 4KB async pinned + flush + clWaitForEvents", {cl_event e; clEnqueueReadBuffer(q,m,CL_FALSE,0,4096,pinp,0,0,&e); clFlush(q); clWaitForEvents(1,&e); clReleaseEvent(e);});
  BENCH("read 4KB async pageable + flush + clWaitForEvents", {cl_event e; clEnqueueReadBuffer(q,m,CL_FALSE,0,4096,h,0,0,&e); clFlush(q); clWaitForEvents(1,&e); clReleaseEvent(e);});
  }
  atomic_store(&job,3); pthread_join(th,0);
  return 0;
}
