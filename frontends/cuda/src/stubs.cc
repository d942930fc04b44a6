// Every entry point of the real runtime that Tandem does not implement: a weak definition
// generated from exports.def that logs the name once and answers cudaErrorNotSupported.
// The hand-written definitions in the other files are strong and replace these at link
// time. Only functions returning cudaError_t are generated (X rows); the others (S rows)
// are hand-written with their real signatures, since their callers expect a value of that
// type (a pointer, or a struct returned through a hidden pointer).
//
// No runtime API header here: these definitions deliberately take no parameters (the
// arguments are ignored, which the x86-64 calling convention allows), so they must not
// meet the real prototypes.
#include <driver_types.h>

namespace tandem::cuda {
cudaError_t Unsupported(const char* name);
}

#define X(name, ret)                                                                 \
  extern "C" __attribute__((weak, visibility("default"))) cudaError_t name() {       \
    return tandem::cuda::Unsupported(#name);                                         \
  }
#define S(name, ret)
#include "exports.def"
#undef S
#undef X
