/* ocl_gap MODE GAP_US [N]: N empty-kernel enqueue + clFinish round trips, natively, with GAP_US
 * between them spent as MODE says; prints the p50 of the enqueue + finish alone.
 *   b2b    no gap (the benchmark's native loop)
 *   spin   the thread busy-waits GAP_US
 *   sleep  the thread sleeps GAP_US (nanosleep), as an executor that blocked does
 *   waiter enqueue + clFlush here, clFinish on a second thread woken by a condition
 *          variable, whose end wakes this one (tandemd's executor and waiter); GAP_US slept
 * Through tandemd the same loop spends 6 us more on the server than this one's b2b
 * (bench/results/2026-11-26-g.md): which of these explains it. */
#include <pthread.h>

#include "../../../examples/opencl/common.h"
#include "../round_trip/timing.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int job = 0, done = 0, quit = 0;
static cl_command_queue queue;

static void* waiter(void* arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (!job && !quit) pthread_cond_wait(&cv, &mu);
    if (quit) break;
    job = 0;
    pthread_mutex_unlock(&mu);
    CHECK(clFinish(queue));
    pthread_mutex_lock(&mu);
    done = 1;
    pthread_cond_broadcast(&cv);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

static void gap(const char* mode, double us) {
  if (us <= 0 || !strcmp(mode, "b2b")) return;
  if (!strcmp(mode, "spin")) {
    double t0 = now_us();
    while (now_us() - t0 < us) {
    }
    return;
  }
  struct timespec ts = {0, (long)(us * 1000)};
  nanosleep(&ts, NULL);
}

int main(int argc, char** argv) {
  EXPECT(argc >= 3);
  const char* mode = argv[1];
  const double gap_us = atof(argv[2]);
  const int n = argc > 3 ? atoi(argv[3]) : 3000;
  const int use_waiter = !strcmp(mode, "waiter");
  EXPECT(use_waiter || !strcmp(mode, "b2b") || !strcmp(mode, "spin") || !strcmp(mode, "sleep"));
  example_env env;
  example_pick(&env, 0);
  queue = env.queue;
  cl_program prog = example_build(&env, "__kernel void empty(void) {}", NULL);
  cl_kernel k = example_kernel(prog, "empty");
  size_t g = 1;
  pthread_t th;
  if (use_waiter) EXPECT(pthread_create(&th, NULL, waiter, NULL) == 0);
  double* t = malloc(sizeof(double) * (size_t)n);
  EXPECT(t != NULL && n > 0);
  for (int i = 0; i < n; ++i) {
    gap(use_waiter ? "sleep" : mode, gap_us);
    double t0 = now_us();
    CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    if (use_waiter) {
      CHECK(clFlush(env.queue));
      pthread_mutex_lock(&mu);
      job = 1;
      done = 0;
      pthread_cond_broadcast(&cv);
      while (!done) pthread_cond_wait(&cv, &mu);
      pthread_mutex_unlock(&mu);
    } else {
      CHECK(clFinish(env.queue));
    }
    t[i] = now_us() - t0;
  }
  if (use_waiter) {
    pthread_mutex_lock(&mu);
    quit = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(th, NULL);
  }
  sort_samples(t, n);
  printf("opencl %-6s gap %5.0f us: p50 %.1f us p10 %.1f p90 %.1f\n", mode, gap_us, t[n / 2], t[n / 10], t[9 * n / 10]);
  free(t);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  example_release(&env);
  return 0;
}
