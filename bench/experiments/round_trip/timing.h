/* The round-trip experiments' clock and sort (ocl_loop.c, ocl_sync_paths.c). */
#ifndef TANDEM_ROUND_TRIP_TIMING_H
#define TANDEM_ROUND_TRIP_TIMING_H

#include <stdlib.h>
#include <time.h>

static inline double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Sorts n samples in place, for their percentiles. */
static inline int compare_doubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}
static inline void sort_samples(double* t, int n) { qsort(t, (size_t)n, sizeof(double), compare_doubles); }

#endif
