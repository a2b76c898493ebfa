# The CUDA backend (src/backend/cuda). KEV_CUDA=auto builds it when CMake finds nvcc, on requires it,
# off skips it. Sets KEV_HAVE_CUDA and defines kev_add_cuda_backend(target), which adds the backend's
# sources to `target` and links cudart (cuBLASLt is loaded when the backend starts: cublaslt_api.h).
# The default architectures are those Kev targets: Ampere (A100, sm_80), Ada (L4/L40, sm_89) and Hopper
# (H100/H200, sm_90).
set(KEV_CUDA auto CACHE STRING "Build the CUDA backend: auto (when nvcc is found), on, off")
set_property(CACHE KEV_CUDA PROPERTY STRINGS auto on off)
set(KEV_HAVE_CUDA OFF)

if(NOT KEV_CUDA STREQUAL "off")
  if(NOT KEV_CUDA MATCHES "^(auto|on)$")
    message(FATAL_ERROR "KEV_CUDA=${KEV_CUDA}: expected auto, on or off")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 89 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(KEV_HAVE_CUDA ON)
    message(STATUS "kev: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(KEV_CUDA STREQUAL "on")
    message(FATAL_ERROR "KEV_CUDA=on but no CUDA compiler was found: install the CUDA toolkit, put nvcc on PATH "
                        "or set CMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc (or configure with -DKEV_CUDA=off)")
  else()
    message(STATUS "kev: CUDA backend off (no nvcc found; KEV_CUDA=auto)")
  endif()
endif()

function(kev_add_cuda_backend target)
  file(GLOB cuda_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu
       ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cpp)
  target_sources(${target} PRIVATE ${cuda_srcs})
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  # Warnings stay visible for .cu files (nvcc's own, and the host compiler's through -Xcompiler) but are
  # not errors: nvcc's generated host stubs trip GCC warnings that differ between toolkit versions.
  # The backend's .cpp files are CXX and get ${KEV_WARNINGS} (with -Werror) from kev_module.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
  # cuBLASLt's header only: the library is dlopen'ed by create_backend("cuda") (cublaslt_api.h says
  # why), first by its soname, then from the toolkit directory found here.
  target_link_libraries(${target} PRIVATE CUDA::cudart_static ${CMAKE_DL_LIBS})
  set_property(SOURCE ${PROJECT_SOURCE_DIR}/src/backend/cuda/cublaslt_api.cpp APPEND PROPERTY COMPILE_DEFINITIONS
               KEV_CUDA_LIBRARY_DIR="${CUDAToolkit_LIBRARY_DIR}")
  target_compile_definitions(${target} PUBLIC KEV_HAVE_CUDA)
endfunction()
