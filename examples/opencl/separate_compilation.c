/* OpenCL 1.2 separate compilation: clCompileProgram with an embedded header, clLinkProgram of
 * two compiled objects, a library made with -create-library and linked with a third object,
 * the binary types along the way, and a link that fails (an undefined function): its code,
 * and, where the implementation returns a program for it, that it has no kernels. Kernels from both links run and are
 * checked against the CPU. */
#include "common.h"

static const char* kHeader =
    "#define SCALE 3\n"
    "int scaled(int x);\n"
    "int offset(int x);\n";

static const char* kMath =
    "#include \"mathlib.h\"\n"
    "int scaled(int x) { return x * SCALE; }\n"
    "int offset(int x) { return x + 11; }\n";

static const char* kKernel =
    "#include \"mathlib.h\"\n"
    "__kernel void apply(__global int* v) {\n"
    "  size_t i = get_global_id(0);\n"
    "  v[i] = offset(scaled(v[i]));\n"
    "}\n";

static const char* kMissing =
    "int nowhere(int x);\n"
    "__kernel void lost(__global int* v) { v[get_global_id(0)] = nowhere(1); }\n";

static const char* type_name(cl_program_binary_type t) {
  switch (t) {
    case CL_PROGRAM_BINARY_TYPE_NONE: return "none";
    case CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT: return "compiled object";
    case CL_PROGRAM_BINARY_TYPE_LIBRARY: return "library";
    case CL_PROGRAM_BINARY_TYPE_EXECUTABLE: return "executable";
    default: return "?";
  }
}

static void print_type(const char* what, cl_program p, cl_device_id d) {
  cl_program_binary_type t;
  CHECK(clGetProgramBuildInfo(p, d, CL_PROGRAM_BINARY_TYPE, sizeof t, &t, NULL));
  printf("%s: %s\n", what, type_name(t));
}

static cl_program from_source(example_env* env, const char* src) {
  cl_int err;
  cl_program p = clCreateProgramWithSource(env->context, 1, &src, NULL, &err);
  CHECK_ERR(err, "clCreateProgramWithSource");
  return p;
}

static void compile(example_env* env, cl_program p, cl_program header) {
  const char* name = "mathlib.h";
  cl_int err = clCompileProgram(p, 1, &env->device, NULL, 1, &header, &name, NULL, NULL);
  if (err != CL_SUCCESS) {
    size_t n = 0;
    clGetProgramBuildInfo(p, env->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    char* log = (char*)calloc(n + 1, 1);
    clGetProgramBuildInfo(p, env->device, CL_PROGRAM_BUILD_LOG, n, log, NULL);
    fprintf(stderr, "clCompileProgram: %d\n%s\n", (int)err, log);
    exit(1);
  }
}

/* Runs apply() of `p` over 256 values and compares with the CPU. */
static int run_apply(example_env* env, cl_program p) {
  cl_kernel k = example_kernel(p, "apply");
  int in[256], out[256];
  for (int i = 0; i < 256; ++i) in[i] = i - 100;
  cl_mem m = example_buffer(env, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof in, in);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  size_t global = 256;
  CHECK(clEnqueueNDRangeKernel(env->queue, k, 1, NULL, &global, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env->queue, m, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
  int bad = 0;
  for (int i = 0; i < 256; ++i) bad += out[i] != in[i] * 3 + 11;
  clReleaseMemObject(m);
  clReleaseKernel(k);
  return bad;
}

int main(void) {
  example_env env;
  example_pick(&env, 0);
  cl_int err;
  cl_program header = from_source(&env, kHeader);
  cl_program math = from_source(&env, kMath);
  cl_program kernel = from_source(&env, kKernel);
  print_type("before compiling", kernel, env.device);
  compile(&env, math, header);
  compile(&env, kernel, header);
  print_type("compiled", kernel, env.device);
  cl_kernel none = clCreateKernel(kernel, "apply", &err);
  /* Refused; the code differs between implementations (PoCL: CL_INVALID_KERNEL_NAME; the
   * specification and Tandem: CL_INVALID_PROGRAM_EXECUTABLE). */
  printf("kernel from a compiled object: %s\n", none ? "made" : "refused");
  if (none) clReleaseKernel(none);

  /* Two objects into an executable. */
  cl_program objects[2] = {math, kernel};
  cl_program exe = clLinkProgram(env.context, 1, &env.device, NULL, 2, objects, NULL, NULL, &err);
  CHECK_ERR(err, "clLinkProgram");
  print_type("linked", exe, env.device);
  size_t nk = 0;
  CHECK(clGetProgramInfo(exe, CL_PROGRAM_NUM_KERNELS, sizeof nk, &nk, NULL));
  char names[256] = {0};
  CHECK(clGetProgramInfo(exe, CL_PROGRAM_KERNEL_NAMES, sizeof names, names, NULL));
  printf("kernels: %zu (%s)\n", nk, names);
  printf("apply from two objects: %s\n", run_apply(&env, exe) == 0 ? "matches the CPU" : "WRONG");

  /* The math object as a library, linked with the kernel object. */
  cl_program lib = clLinkProgram(env.context, 1, &env.device, "-create-library", 1, &math, NULL, NULL, &err);
  CHECK_ERR(err, "clLinkProgram(-create-library)");
  print_type("library", lib, env.device);
  cl_program parts[2] = {kernel, lib};
  cl_program exe2 = clLinkProgram(env.context, 1, &env.device, NULL, 2, parts, NULL, NULL, &err);
  CHECK_ERR(err, "clLinkProgram(object + library)");
  /* What it was linked from goes at once, as programs often do: the executable stays. */
  CHECK(clReleaseProgram(lib));
  CHECK(clReleaseProgram(math));
  printf("apply from an object and a library: %s\n", run_apply(&env, exe2) == 0 ? "matches the CPU" : "WRONG");
  printf("again: %s\n", run_apply(&env, exe2) == 0 ? "matches the CPU" : "WRONG");

  /* Linking an object that calls a function nobody defines. */
  cl_program missing = from_source(&env, kMissing);
  CHECK(clCompileProgram(missing, 1, &env.device, NULL, 0, NULL, NULL, NULL, NULL));
  cl_program broken = clLinkProgram(env.context, 1, &env.device, NULL, 1, &missing, NULL, NULL, &err);
  printf("link with an undefined function: %s\n",
         err == CL_LINK_PROGRAM_FAILURE ? "CL_LINK_PROGRAM_FAILURE" : (err == CL_SUCCESS ? "CL_SUCCESS" : "another error"));
  if (broken) {
    cl_build_status st;
    CHECK(clGetProgramBuildInfo(broken, env.device, CL_PROGRAM_BUILD_STATUS, sizeof st, &st, NULL));
    printf("its build status: %s\n", st == CL_BUILD_ERROR ? "CL_BUILD_ERROR" : "not an error");
    cl_kernel k = clCreateKernel(broken, "lost", &err);
    printf("kernel from it: %s\n", k ? "made" : "refused");
    if (k) clReleaseKernel(k);
    clReleaseProgram(broken);
  }

  /* Wrong uses (an uncompiled input, no inputs) are left out: NVIDIA's OpenCL links a program
   * that was never compiled and answers no inputs with another code than the specification's
   * (CL_INVALID_OPERATION, CL_INVALID_VALUE, which Tandem answers). */
  cl_program progs[] = {missing, exe2, exe, kernel, header};
  for (size_t i = 0; i < sizeof progs / sizeof progs[0]; ++i) clReleaseProgram(progs[i]);
  example_release(&env);
  return 0;
}
