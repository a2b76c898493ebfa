# KEV_WEBGPU=auto|on|off. (Owned by the WebGPU backend work; placeholder until it lands.)
set(KEV_WEBGPU auto CACHE STRING "Build the WebGPU backend: auto (when Dawn is found), on, off")
set(KEV_HAVE_WEBGPU OFF)
