// napper THREADS SECONDS [NAP_US]: THREADS threads that each sleep NAP_US (default 20) in a
// loop for SECONDS, as Tandem's idle threads nap beside a thread reading its own reply (the
// program's progress and receive threads, the flusher, the worker's progress thread: each about
// 12,000 wake-ups a second in spread.sh). Prints the wake-ups per second it made. Background
// load for noise_ab.sh: do such wake-ups on other CPUs slow a round trip?
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double seconds;
static long nap_ns;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void* nap(void* arg) {
  long* count = arg;
  const double end = now() + seconds;
  struct timespec ts = {0, nap_ns};
  while (now() < end) {
    nanosleep(&ts, NULL);
    ++*count;
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: napper THREADS SECONDS [NAP_US]\n");
    return 2;
  }
  int n = atoi(argv[1]);
  seconds = atof(argv[2]);
  nap_ns = (argc > 3 ? atol(argv[3]) : 20) * 1000;
  if (n < 1 || n > 64) return 2;
  pthread_t t[64];
  long counts[64] = {0};
  for (int i = 0; i < n; ++i) pthread_create(&t[i], NULL, nap, &counts[i]);
  long total = 0;
  for (int i = 0; i < n; ++i) {
    pthread_join(t[i], NULL);
    total += counts[i];
  }
  printf("napper: %d threads, %.0f wake-ups a second each\n", n, total / seconds / n);
  return 0;
}
