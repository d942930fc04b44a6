/* A program that fails to build: prints clBuildProgram's code, the build status, whether
 * the log mentions an error and the log's first line that does. Then checks that the
 * broken program gives no kernels and that a good one still builds in the same context. */
#include "common.h"

static const char* kBad =
    "__kernel void broken(__global int* x) {\n"
    "  x[get_global_id(0)] = undeclared_identifier + 1;\n"
    "}\n";

static const char* kGood = "__kernel void fine(__global int* x) { x[get_global_id(0)] = 7; }\n";

/* Compilers name the source by a temporary file (PoCL: /tmp/.../tempfile_XXXXXX.cl:2:25):
 * replace every "<path>.cl:" by "<source>:" so the line is the same from run to run. */
static char* without_paths(const char* line) {
  static char out[1024];
  size_t o = 0;
  for (const char* p = line; *p && o + 16 < sizeof out;) {
    const char* tok_end = p;
    while (*tok_end && *tok_end != ' ' && *tok_end != '\t') ++tok_end;
    const char* cl = NULL;
    for (const char* q = p; q + 3 < tok_end; ++q)
      if (q[0] == '.' && q[1] == 'c' && q[2] == 'l' && q[3] == ':') cl = q;
    if (cl) {
      o += (size_t)snprintf(out + o, sizeof out - o, "<source>");
      p = cl + 3;
    }
    while (p < tok_end && o + 2 < sizeof out) out[o++] = *p++;
    while (*p == ' ' || *p == '\t') {
      if (o + 2 < sizeof out) out[o++] = *p;
      ++p;
    }
  }
  out[o] = '\0';
  return out;
}

int main(void) {
  example_env env;
  example_pick(&env, 0);
  cl_int err;
  cl_program prog = clCreateProgramWithSource(env.context, 1, &kBad, NULL, &err);
  CHECK_ERR(err, "clCreateProgramWithSource");
  cl_int build_err = clBuildProgram(prog, 1, &env.device, NULL, NULL, NULL);
  printf("clBuildProgram: %d%s\n", (int)build_err, build_err == CL_BUILD_PROGRAM_FAILURE ? " (CL_BUILD_PROGRAM_FAILURE)" : "");
  cl_build_status status;
  CHECK(clGetProgramBuildInfo(prog, env.device, CL_PROGRAM_BUILD_STATUS, sizeof status, &status, NULL));
  printf("build status: %d%s\n", (int)status, status == CL_BUILD_ERROR ? " (CL_BUILD_ERROR)" : "");

  size_t n = 0;
  CHECK(clGetProgramBuildInfo(prog, env.device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n));
  char* log = (char*)calloc(n + 1, 1);
  CHECK(clGetProgramBuildInfo(prog, env.device, CL_PROGRAM_BUILD_LOG, n, log, NULL));
  int terminated = n > 0 && log[n - 1] == '\0';
  char* first = NULL;
  for (char* line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
    if (strstr(line, "error")) {
      first = line;
      break;
    }
  printf("log is NUL-terminated: %s\n", terminated ? "yes" : "no");
  printf("log mentions an error: %s\n", first ? "yes" : "no");
  /* The text differs between compilers, but natively and through Tandem on one machine it
   * must be the same. */
  printf("first error line: %s\n", first ? without_paths(first) : "(none)");
  printf("names the identifier: %s\n", first && strstr(first, "undeclared_identifier") ? "yes" : "no");

  cl_kernel k = clCreateKernel(prog, "broken", &err);
  printf("clCreateKernel on failed program: %d%s\n", (int)err,
         err == CL_INVALID_PROGRAM_EXECUTABLE ? " (CL_INVALID_PROGRAM_EXECUTABLE)" : "");
  if (k) clReleaseKernel(k);
  free(log);
  clReleaseProgram(prog);

  cl_program good = example_build(&env, kGood, NULL);
  cl_kernel fine = example_kernel(good, "fine");
  cl_mem m = example_buffer(&env, CL_MEM_READ_WRITE, 64 * sizeof(int), NULL);
  CHECK(clSetKernelArg(fine, 0, sizeof m, &m));
  size_t global = 64;
  int out[64];
  CHECK(clEnqueueNDRangeKernel(env.queue, fine, 1, NULL, &global, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env.queue, m, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
  int ok = 1;
  for (int i = 0; i < 64; ++i) ok &= out[i] == 7;
  printf("a good program still builds and runs: %s\n", ok ? "yes" : "no");
  clReleaseMemObject(m);
  clReleaseKernel(fine);
  clReleaseProgram(good);
  example_release(&env);
  int expected = build_err == CL_BUILD_PROGRAM_FAILURE && err == CL_INVALID_PROGRAM_EXECUTABLE && status == CL_BUILD_ERROR && first && ok;
  return expected ? 0 : 1;
}
