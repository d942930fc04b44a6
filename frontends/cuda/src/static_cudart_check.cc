// A program built with nvcc's default static cudart carries its own runtime and never calls
// this library: its kernels would run on a local GPU, or fail for lack of one, and Tandem
// would silently do nothing. Detect it when the library loads: the executable holds device
// code (.nv_fatbin) but does not depend on libcudart.so.13.
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string_view>

#include "tandem/log.h"

namespace {

struct Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data) munmap(const_cast<uint8_t*>(data), size);
  }
};

// True if the ELF file has device code and no DT_NEEDED entry for the shared runtime.
bool StaticCudart(const Mapping& m) {
  if (m.size < sizeof(Elf64_Ehdr) || std::memcmp(m.data, ELFMAG, SELFMAG) != 0 || m.data[EI_CLASS] != ELFCLASS64)
    return false;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(m.data);
  if (eh->e_shoff == 0 || eh->e_shoff + uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr) > m.size || eh->e_shstrndx >= eh->e_shnum)
    return false;
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(m.data + eh->e_shoff);
  const Elf64_Shdr& names = sh[eh->e_shstrndx];
  bool device_code = false, shared_cudart = false;
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (names.sh_offset + sh[i].sh_name < m.size &&
        std::string_view(reinterpret_cast<const char*>(m.data + names.sh_offset + sh[i].sh_name)) == ".nv_fatbin")
      device_code = true;
    if (sh[i].sh_type != SHT_DYNAMIC || sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr& strtab = sh[sh[i].sh_link];
    if (sh[i].sh_offset + sh[i].sh_size > m.size) continue;
    const auto* dyn = reinterpret_cast<const Elf64_Dyn*>(m.data + sh[i].sh_offset);
    for (size_t j = 0; j < sh[i].sh_size / sizeof(Elf64_Dyn); ++j) {
      if (dyn[j].d_tag != DT_NEEDED || strtab.sh_offset + dyn[j].d_un.d_val >= m.size) continue;
      std::string_view lib(reinterpret_cast<const char*>(m.data + strtab.sh_offset + dyn[j].d_un.d_val));
      if (lib.starts_with("libcudart.so")) shared_cudart = true;
    }
  }
  return device_code && !shared_cudart;
}

__attribute__((constructor)) void CheckExecutable() {
  int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  Mapping m;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      m.data = static_cast<const uint8_t*>(p);
      m.size = static_cast<size_t>(st.st_size);
    }
  }
  close(fd);
  if (m.data && StaticCudart(m))
    tandem::log::Error(
        "this program carries its own static CUDA runtime, so Tandem cannot run its kernels: "
        "rebuild it with `nvcc -cudart shared` (or link with -lcudart instead of -lcudart_static)");
}

}  // namespace
