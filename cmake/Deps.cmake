# Third-party libraries, all from Debian/Ubuntu packages (see README.md for why each).
# `.deps/include` is a fallback for machines that have a library's runtime but not its
# headers (the GPU machine has libfabric1 without libfabric-dev): scripts/device-deps.sh fills it.
set(TANDEM_DEPS_HINT ${PROJECT_SOURCE_DIR}/.deps/include)

find_package(Threads REQUIRED)
find_package(fmt REQUIRED)

find_path(FABRIC_INCLUDE_DIR rdma/fabric.h HINTS ${TANDEM_DEPS_HINT})
find_library(FABRIC_LIBRARY NAMES fabric libfabric.so.1)
if(NOT FABRIC_INCLUDE_DIR OR NOT FABRIC_LIBRARY)
  message(FATAL_ERROR "libfabric not found: install libfabric-dev (scripts/setup.sh does)")
endif()
add_library(tandem::libfabric INTERFACE IMPORTED)
target_include_directories(tandem::libfabric SYSTEM INTERFACE ${FABRIC_INCLUDE_DIR})
target_link_libraries(tandem::libfabric INTERFACE ${FABRIC_LIBRARY})

find_path(XXHASH_INCLUDE_DIR xxhash.h HINTS ${TANDEM_DEPS_HINT})
find_library(XXHASH_LIBRARY NAMES xxhash libxxhash.so.0)
if(NOT XXHASH_INCLUDE_DIR OR NOT XXHASH_LIBRARY)
  message(FATAL_ERROR "xxHash not found: install libxxhash-dev (scripts/setup.sh does)")
endif()
add_library(tandem::xxhash INTERFACE IMPORTED)
target_include_directories(tandem::xxhash SYSTEM INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(tandem::xxhash INTERFACE ${XXHASH_LIBRARY})

find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp HINTS ${TANDEM_DEPS_HINT})
if(NOT CLI11_INCLUDE_DIR)
  message(FATAL_ERROR "CLI11 not found: install libcli11-dev")
endif()
add_library(tandem::cli11 INTERFACE IMPORTED)
target_include_directories(tandem::cli11 SYSTEM INTERFACE ${CLI11_INCLUDE_DIR})

# OpenCL headers: the front end needs cl_icd.h; the server backend links the ICD loader.
find_path(OPENCL_INCLUDE_DIR CL/cl_icd.h HINTS ${TANDEM_DEPS_HINT})
find_library(OPENCL_LIBRARY NAMES OpenCL libOpenCL.so.1)
if(NOT OPENCL_INCLUDE_DIR OR NOT OPENCL_LIBRARY)
  message(FATAL_ERROR "OpenCL headers/loader not found: install opencl-headers ocl-icd-opencl-dev")
endif()

include(CheckLanguage)
check_language(CUDA)
