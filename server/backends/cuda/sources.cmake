# The CUDA backend's sources, added to server/CMakeLists.txt's tandem_backend_cuda target by
#   include(backends/cuda/sources.cmake)
# right after that target is declared. Without the CUDA toolkit's headers only
# cuda_backend.cc is built, and MakeCudaBackend answers kUnimplemented.
# Only cuda.h is needed, so look for it directly: FindCUDAToolkit also insists on libraries
# (libcudart) that a server never uses and some installations lack.
find_package(CUDAToolkit QUIET)
find_path(TANDEM_CUDA_INCLUDE_DIR cuda.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT} $ENV{CUDA_HOME} $ENV{CUDA_PATH} /usr/local/cuda
  PATH_SUFFIXES include)
if(TANDEM_CUDA_INCLUDE_DIR)
  target_sources(tandem_backend_cuda PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/cuda_driver.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda_output.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda_memory.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda_transfer.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda_module.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda_launch.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda_events.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda_async.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda_warm.cc)
  # cuda.h only: the driver is opened with dlopen, never linked.
  target_include_directories(tandem_backend_cuda SYSTEM PRIVATE ${TANDEM_CUDA_INCLUDE_DIR})
  target_compile_definitions(tandem_backend_cuda PRIVATE TANDEM_CUDA_BACKEND=1)
  target_link_libraries(tandem_backend_cuda PRIVATE fmt::fmt Threads::Threads ${CMAKE_DL_LIBS})
else()
  message(STATUS "cuda.h not found (set CUDAToolkit_ROOT): tandemd's CUDA backend is a placeholder")
endif()
