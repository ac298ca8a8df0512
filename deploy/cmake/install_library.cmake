# libddp for users' LibTorch programs: the library, its headers, the static
# helpers it links publicly and a CMake package so that `find_package(ddp)` +
# `target_link_libraries(x ddp::ddp)` works (component "dev": libddp-dev).
#
# The static helpers (ddprun_common, ddprun_proto) are part of the export set:
# libddp's headers include theirs and its link interface names them, so a
# consumer needs them as imported targets.
#
# Installed include layout, one root so that the project's own include
# spelling ("worker/x.h", "common/x.h", "ddprun/v1/x.pb.h") works unchanged:
#   include/ddp/worker/*.h  include/ddp/common/*.h  include/ddp/ddprun/v1/*.h
set(DDP_INCLUDE_ROOT ${CMAKE_INSTALL_INCLUDEDIR}/ddp)

set(ddp_export_targets)
foreach(target libddp ddprun_common ddprun_proto)
  if(TARGET ${target})
    list(APPEND ddp_export_targets ${target})
  endif()
endforeach()
if(NOT ddp_export_targets)
  return()
endif()

# The parts add their include directories as plain source/build paths, which
# CMake refuses to export. Keep them for the build tree and point the
# installed package at DDP_INCLUDE_ROOT instead.
function(ddp_make_exportable target)
  foreach(property INTERFACE_INCLUDE_DIRECTORIES
                   INTERFACE_SYSTEM_INCLUDE_DIRECTORIES)
    get_target_property(dirs ${target} ${property})
    if(NOT dirs)
      continue()
    endif()
    set(wrapped)
    foreach(dir IN LISTS dirs)
      if(dir MATCHES "^\\$<")
        list(APPEND wrapped "${dir}")
      else()
        list(APPEND wrapped "$<BUILD_INTERFACE:${dir}>")
      endif()
    endforeach()
    if(property STREQUAL "INTERFACE_INCLUDE_DIRECTORIES")
      list(APPEND wrapped "$<INSTALL_INTERFACE:${DDP_INCLUDE_ROOT}>")
    endif()
    set_property(TARGET ${target} PROPERTY ${property} "${wrapped}")
  endforeach()
  # Precompiled headers are a build-time speed-up, never part of the API.
  get_target_property(pch ${target} INTERFACE_PRECOMPILE_HEADERS)
  if(pch)
    set_property(TARGET ${target} PROPERTY INTERFACE_PRECOMPILE_HEADERS
      "$<BUILD_INTERFACE:${pch}>")
  endif()
endfunction()

foreach(target IN LISTS ddp_export_targets)
  ddp_make_exportable(${target})
endforeach()
if(TARGET libddp)
  # ddp::ddp rather than ddp::libddp.
  set_target_properties(libddp PROPERTIES EXPORT_NAME ddp)
endif()

# A shared libddp (BUILD_SHARED_LIBS) links LibTorch: it goes with the
# headers in libddp-dev, never in the launcher's package (runtime), which
# needs no LibTorch.
install(TARGETS ${ddp_export_targets} EXPORT ddpTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT dev
  INCLUDES DESTINATION ${DDP_INCLUDE_ROOT})

# Headers: every public header of the exported parts.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/common/
  DESTINATION ${DDP_INCLUDE_ROOT}/common COMPONENT dev
  FILES_MATCHING PATTERN "*.h")
if(TARGET libddp)
  # libddp's API, exactly: what a program includes, and nothing these
  # headers need beyond it (tests/deploy/install_consumer_test.sh compiles
  # each alone against the install). The gradient allreduce, its arena,
  # shared memory, the lazy group, the store client, gRPC store, NCCL seam,
  # error file, node cache and process helpers stay inside (worker/README.md).
  set(ddp_public_headers
    ddp.h process_group.h collectives.h gradient_path.h worker_env.h
    distributed_sampler.h checkpoint.h atomic_file.h recovery.h standby.h
    progress.h phase.h abortable.h)
  list(TRANSFORM ddp_public_headers PREPEND ${PROJECT_SOURCE_DIR}/worker/)
  install(FILES ${ddp_public_headers}
    DESTINATION ${DDP_INCLUDE_ROOT}/worker COMPONENT dev)
endif()
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/ddprun/
  DESTINATION ${DDP_INCLUDE_ROOT}/ddprun COMPONENT dev
  FILES_MATCHING PATTERN "*.h")

set(DDP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${DDP_CMAKE_DIR}
  COMPONENT dev)

include(CMakePackageConfigHelpers)
# The config asks for Torch only when libddp is in the package.
if(TARGET libddp)
  set(DDP_WITH_TORCH ON)
else()
  set(DDP_WITH_TORCH OFF)
endif()
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/ddpConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ddpConfig.cmake
  INSTALL_DESTINATION ${DDP_CMAKE_DIR})
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/ddpConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/ddpConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/ddpConfigVersion.cmake
  DESTINATION ${DDP_CMAKE_DIR} COMPONENT dev)
