// The kernel's loopback TCP after a quiet gap, with no libfabric and no Tandem: two processes,
// one connection (TCP_NODELAY), 8 B ping-pong, both sides busy-polling non-blocking sockets the
// whole time (no thread ever sleeps). Prints the warm p50 round trip and the p50 of the first
// round trip after each quiet gap, alone and with a ping every KEEPALIVE_US during the gap (as
// Tandem's keepalive sends after TANDEM_KEEPALIVE_MS of quiet). What is left after a gap here
// is the machine's (kernel, VM), which no library on top of TCP can take away.
//   cc -O2 -o quiet_tcp quiet_tcp.c && ./quiet_tcp [KEEPALIVE_US (default 2000)]
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void die(const char* what) {
  perror(what);
  exit(1);
}

// Busy-polls until n bytes came (or the peer closed: returns 0).
static int recv_all(int fd, char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
    if (r > 0) got += (size_t)r;
    else if (r == 0) return 0;
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die("recv");
  }
  return 1;
}

static void send_all(int fd, const char* buf, size_t n) {
  size_t sent = 0;
  while (sent < n) {
    ssize_t r = send(fd, buf + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r > 0) sent += (size_t)r;
    else if (r < 0 && errno != EAGAIN && errno != EINTR) die("send");
  }
}

static double rtt(int fd) {
  char b[8] = {1};
  double t0 = now_us();
  send_all(fd, b, 8);
  if (!recv_all(fd, b, 8)) die("peer closed");
  return now_us() - t0;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double p50(double* v, int n) {
  qsort(v, n, sizeof *v, cmp);
  return v[n / 2];
}

// Quiet for gap_us, busy-waiting; with keepalive_us > 0, a ping every keepalive_us meanwhile
// (the last one at least keepalive_us before the gap's end, as a keepalive that fires after
// that long of quiet would).
static void quiet(int fd, double gap_us, double keepalive_us) {
  double start = now_us(), last = start;
  for (;;) {
    double t = now_us();
    if (t - start >= gap_us) return;
    if (keepalive_us > 0 && t - last >= keepalive_us && start + gap_us - t >= 1) {
      rtt(fd);
      last = now_us();
    }
  }
}

int main(int argc, char** argv) {
  double keepalive_us = argc > 1 ? atof(argv[1]) : 2000;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) die("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr*)&a, sizeof a) || listen(ls, 1)) die("bind/listen");
  socklen_t al = sizeof a;
  getsockname(ls, (struct sockaddr*)&a, &al);
  pid_t child = fork();
  if (child == 0) {  // the echoing side
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char b[8];
    while (recv_all(fd, b, 8)) send_all(fd, b, 8);
    _exit(0);
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a)) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  static double v[20000];
  for (int i = 0; i < 2000; ++i) rtt(fd);
  for (int i = 0; i < 20000; ++i) v[i] = rtt(fd);
  double warm = p50(v, 20000);
  printf("quiet_tcp: loopback TCP, 8 B round trip, both sides busy-polling; warm p50 %.1f us\n", warm);
  printf("%-10s | %-19s | %s\n", "quiet gap", "alone (p50, x warm)", "a ping through the gap every KEEPALIVE_US (p50, x warm)");
  struct { double ms; int reps; } gaps[] = {{0.1, 200}, {1, 100}, {2, 100}, {5, 60}, {20, 40}, {100, 20}};
  for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; ++g) {
    double alone[200], kept[200];
    for (int r = 0; r < gaps[g].reps; ++r) {
      quiet(fd, gaps[g].ms * 1000, 0);
      alone[r] = rtt(fd);
      quiet(fd, gaps[g].ms * 1000, keepalive_us);
      kept[r] = rtt(fd);
    }
    double x = p50(alone, gaps[g].reps), y = p50(kept, gaps[g].reps);
    printf("%7.1f ms | %7.1f us (%.2fx) | %7.1f us (%.2fx), every %.0f us\n", gaps[g].ms, x, x / warm, y, y / warm,
           keepalive_us);
  }
  close(fd);
  waitpid(child, NULL, 0);
  return 0;
}
