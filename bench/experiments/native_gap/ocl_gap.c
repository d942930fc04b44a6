/* ocl_gap MODE GAP_US [N]: N empty-kernel enqueue + clFinish round trips, natively, with GAP_US
 * between them spent as MODE says; prints the p50 of the enqueue + finish alone.
 *   b2b    no gap (the benchmark's native loop)
 *   spin   the thread busy-waits GAP_US
 *   sleep  the thread sleeps GAP_US (nanosleep), as an executor that blocked does
 *   waiter enqueue + clFlush here, clFinish on a second thread woken by a condition
 *          variable, whose end wakes this one; GAP_US slept
 *   wspin  enqueue here, clFinish on a second thread that spins for the hand-over (no flush
 *          first), this one spinning for its end: tandemd's executor and spinning waiter
 *   wspinf the same with clFlush before the hand-over
 *   wevent the kernel's own event handed to the spinning thread, which waits with
 *          clWaitForEvents instead of clFinish (clFlush first, as clWaitForEvents requires)
 *   wpoll  the same, the spinning thread polling the event's status instead
 *   wmarker as wevent, but the event is a marker's enqueued after the kernel (which has none)
 *   event  back to back, the kernel enqueued with an event, clFinish, the event released:
 *          what asking for the event costs alone
 * SPINNERS=K in the environment: K more threads spin (pause) throughout, as tandemd's and the
 * client's polling threads do on the same host.
 * Through tandemd the same loop spends 6 us more on the server than this one's b2b
 * (bench/results/2026-11-26-g.md): which of these explains it. */
#include <pthread.h>
#include <stdatomic.h>

#include "../../../examples/opencl/common.h"
#include "../round_trip/timing.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int job = 0, done = 0, quit = 0;
static cl_command_queue queue;
static atomic_int sjob, sdone, squit;
static cl_event sevent;  // wevent / wpoll: the event to wait for (released by the waiter)
static int wait_kind;    // 0 clFinish, 1 clWaitForEvents, 2 polling the status

static void* spin_waiter(void* arg) {
  (void)arg;
  for (;;) {
    while (!atomic_load(&sjob) && !atomic_load(&squit)) __builtin_ia32_pause();
    if (atomic_load(&squit)) break;
    atomic_store(&sjob, 0);
    if (wait_kind == 0) {
      CHECK(clFinish(queue));
    } else if (wait_kind == 1) {
      CHECK(clWaitForEvents(1, &sevent));
      CHECK(clReleaseEvent(sevent));
    } else {
      cl_int st = CL_QUEUED;
      do {
        CHECK(clGetEventInfo(sevent, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
      } while (st > CL_COMPLETE);
      EXPECT(st == CL_COMPLETE);
      CHECK(clReleaseEvent(sevent));
    }
    atomic_store(&sdone, 1);
  }
  return NULL;
}

static void* spinner(void* arg) {
  (void)arg;
  while (!atomic_load(&squit)) __builtin_ia32_pause();
  return NULL;
}

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
  const int marker = !strcmp(mode, "wmarker");
  wait_kind = !strcmp(mode, "wevent") || marker ? 1 : !strcmp(mode, "wpoll") ? 2 : 0;
  const int use_spin_waiter = !strncmp(mode, "wspin", 5) || wait_kind != 0;
  const int flush_first = !strcmp(mode, "wspinf") || wait_kind != 0;
  const int with_event = (wait_kind != 0 && !marker) || !strcmp(mode, "event");
  EXPECT(use_waiter || use_spin_waiter || !strcmp(mode, "b2b") || !strcmp(mode, "spin") || !strcmp(mode, "sleep") ||
         !strcmp(mode, "event"));
  const int spinners = getenv("SPINNERS") ? atoi(getenv("SPINNERS")) : 0;
  pthread_t spin_th[64];
  EXPECT(spinners >= 0 && spinners <= 64);
  for (int i = 0; i < spinners; ++i) EXPECT(pthread_create(&spin_th[i], NULL, spinner, NULL) == 0);
  example_env env;
  example_pick(&env, 0);
  queue = env.queue;
  cl_program prog = example_build(&env, "__kernel void empty(void) {}", NULL);
  cl_kernel k = example_kernel(prog, "empty");
  size_t g = 1;
  pthread_t th;
  if (use_waiter) EXPECT(pthread_create(&th, NULL, waiter, NULL) == 0);
  if (use_spin_waiter) EXPECT(pthread_create(&th, NULL, spin_waiter, NULL) == 0);
  double* t = malloc(sizeof(double) * (size_t)n);
  double* te = malloc(sizeof(double) * (size_t)n);  // the enqueue call alone
  EXPECT(t != NULL && te != NULL && n > 0);
  double te_sum = 0, tf_sum = 0;
  for (int i = 0; i < n; ++i) {
    gap(use_waiter || use_spin_waiter || with_event ? "sleep" : mode, gap_us);
    double t0 = now_us();
    cl_event ev = NULL;
    CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &g, NULL, 0, NULL, with_event ? &ev : NULL));
    if (marker) CHECK(clEnqueueMarkerWithWaitList(env.queue, 0, NULL, &ev));
    if (use_spin_waiter) sevent = ev;
    te[i] = now_us() - t0;
    if (use_waiter) {
      CHECK(clFlush(env.queue));
      pthread_mutex_lock(&mu);
      job = 1;
      done = 0;
      pthread_cond_broadcast(&cv);
      while (!done) pthread_cond_wait(&cv, &mu);
      pthread_mutex_unlock(&mu);
    } else if (use_spin_waiter) {
      if (flush_first) CHECK(clFlush(env.queue));
      atomic_store(&sdone, 0);
      atomic_store(&sjob, 1);
      while (!atomic_load(&sdone)) __builtin_ia32_pause();
    } else {
      CHECK(clFinish(env.queue));
      if (ev) CHECK(clReleaseEvent(ev));
    }
    t[i] = now_us() - t0;
    te_sum += te[i];
    tf_sum += t[i] - te[i];
  }
  if (use_waiter) {
    pthread_mutex_lock(&mu);
    quit = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(th, NULL);
  }
  atomic_store(&squit, 1);
  if (use_spin_waiter) pthread_join(th, NULL);
  for (int i = 0; i < spinners; ++i) pthread_join(spin_th[i], NULL);
  sort_samples(t, n);
  printf("opencl %-6s spinners %d gap %5.0f us: p50 %.1f us p10 %.1f p90 %.1f\n", mode, spinners, gap_us, t[n / 2], t[n / 10], t[9 * n / 10]);
  sort_samples(te, n);
  printf("  split: enqueue p50 %.1f mean %.1f us; the rest (finish) mean %.1f us\n", te[n / 2], te_sum / n, tf_sum / n);
  free(t);
  free(te);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  example_release(&env);
  return 0;
}
