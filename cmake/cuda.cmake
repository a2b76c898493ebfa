# KEV_CUDA=auto|on|off. (Owned by the CUDA backend work; placeholder until it lands.)
set(KEV_CUDA auto CACHE STRING "Build the CUDA backend: auto (when nvcc is found), on, off")
set(KEV_HAVE_CUDA OFF)
