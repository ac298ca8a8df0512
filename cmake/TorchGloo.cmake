# ddprun_torch_gloo(<out-var>): the shared Gloo library that LibTorch's
# torch_cpu itself links (its NEEDED entry, e.g. Debian's libgloo.so.0), as a
# file to link; "" when LibTorch carries its own Gloo built in (PyTorch's
# archives and wheels) or links none. DirectAllreduce (worker/gloo_direct.cc)
# links only that library, so a process never holds two copies of Gloo.
function(ddprun_torch_gloo out)
  set(${out} "" PARENT_SCOPE)
  if(NOT TARGET torch_cpu)
    return()
  endif()
  get_target_property(location torch_cpu IMPORTED_LOCATION)
  if(NOT location)
    get_target_property(configs torch_cpu IMPORTED_CONFIGURATIONS)
    foreach(config IN LISTS configs)
      get_target_property(location torch_cpu IMPORTED_LOCATION_${config})
      if(location)
        break()
      endif()
    endforeach()
  endif()
  if(NOT location OR NOT EXISTS "${location}")
    message(STATUS "Gloo: torch_cpu's library not found; DirectAllreduce off")
    return()
  endif()
  find_program(DDPRUN_READELF NAMES readelf ${CMAKE_READELF})
  if(NOT DDPRUN_READELF)
    message(STATUS "Gloo: no readelf to read ${location}; DirectAllreduce off")
    return()
  endif()
  execute_process(COMMAND ${DDPRUN_READELF} -d "${location}"
    OUTPUT_VARIABLE dynamic RESULT_VARIABLE status ERROR_QUIET)
  if(NOT status EQUAL 0 OR NOT dynamic MATCHES "\\[(libgloo[^]/]*\\.so[^]/]*)\\]")
    message(STATUS "Gloo: ${location} links no shared libgloo (its own Gloo "
      "is built in); DirectAllreduce off")
    return()
  endif()
  set(soname "${CMAKE_MATCH_1}")
  get_filename_component(torch_lib_dir "${location}" DIRECTORY)
  find_library(DDPRUN_TORCH_GLOO_LIBRARY NAMES "${soname}"
    HINTS "${torch_lib_dir}" NO_CACHE)
  if(NOT DDPRUN_TORCH_GLOO_LIBRARY)
    message(STATUS "Gloo: ${soname} (linked by ${location}) not found; "
      "DirectAllreduce off")
    return()
  endif()
  set(libraries "${DDPRUN_TORCH_GLOO_LIBRARY}")
  # Debian's libgloo_cuda (what its CUDA LibTorch links) leaves Gloo's core
  # to libgloo: link that too, the same copy libgloo_cuda loads.
  execute_process(COMMAND ${DDPRUN_READELF} -d "${DDPRUN_TORCH_GLOO_LIBRARY}"
    OUTPUT_VARIABLE dynamic ERROR_QUIET)
  if(NOT soname STREQUAL "libgloo.so.0" AND dynamic MATCHES "\\[(libgloo\\.so[^]/]*)\\]")
    get_filename_component(gloo_dir "${DDPRUN_TORCH_GLOO_LIBRARY}" DIRECTORY)
    find_library(DDPRUN_TORCH_GLOO_CORE NAMES "${CMAKE_MATCH_1}"
      HINTS "${gloo_dir}" NO_CACHE)
    if(DDPRUN_TORCH_GLOO_CORE)
      list(APPEND libraries "${DDPRUN_TORCH_GLOO_CORE}")
    endif()
  endif()
  message(STATUS "Gloo: ${libraries}, as LibTorch links it")
  set(${out} "${libraries}" PARENT_SCOPE)
endfunction()
