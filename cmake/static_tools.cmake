# DDPRUN_STATIC_TOOLS: ddprun, ddprun-rendezvous and ddprun-relay need
# nothing but the C library at run time. gRPC, protobuf, Abseil, OpenSSL,
# c-ares, RE2 and zlib come from Debian's static archives (lib*.a), spdlog
# and fmt from their headers (cmake/static_tools/spdlog_fmt.cc), libstdc++
# and libgcc from -static-libstdc++ -static-libgcc. So the programs run on any
# x86-64 Linux whose glibc is at least the build machine's, next to any torch.
#
# The project's libraries (ddprun_common, ddprun_launcher, ...) are compiled
# once and serve both kinds of link: the tests and libddp (which shares
# LibTorch's protobuf) link the shared libraries as before; only a program
# marked DDPRUN_STATIC_LINK swaps every third-party library for one GROUP of
# static archives (a linker script, so that the archives' circular
# references resolve in any order). Include after every part's directory.
option(DDPRUN_STATIC_TOOLS
  "Link ddprun, ddprun-rendezvous and ddprun-relay statically (all but glibc)" ON)
set(DDPRUN_STATIC_TOOLS_ACTIVE OFF)
if(NOT DDPRUN_STATIC_TOOLS)
  return()
endif()

# In the order pkg-config --static gives them; the GROUP makes the order moot.
set(static_names grpc++_reflection grpc++ grpc address_sorting upb re2 cares
  gpr protobuf ssl crypto z)
set(static_archives)
set(static_missing)
foreach(name IN LISTS static_names)
  find_library(DDPRUN_STATIC_LIB_${name} NAMES lib${name}.a)
  if(DDPRUN_STATIC_LIB_${name})
    list(APPEND static_archives ${DDPRUN_STATIC_LIB_${name}})
  else()
    list(APPEND static_missing lib${name}.a)
  endif()
endforeach()
# What the archives need beyond that list on this system (pkg-config's
# --static view): Debian 13's libcrypto.a, for one, needs libzstd.a
# (libzstd-dev). glibc's own libraries stay shared.
find_package(PkgConfig REQUIRED)
execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --static --libs-only-l
    grpc++ protobuf libssl libcrypto
  OUTPUT_VARIABLE pkg_libs ERROR_QUIET)
string(REGEX MATCHALL "-l[^ \t\n]+" pkg_libs "${pkg_libs}")
list(REMOVE_DUPLICATES pkg_libs)
foreach(flag IN LISTS pkg_libs)
  string(SUBSTRING "${flag}" 2 -1 name)
  if(name IN_LIST static_names OR name MATCHES "^(absl_.*|c|m|dl|rt|pthread|atomic)$")
    continue()
  endif()
  find_library(DDPRUN_STATIC_LIB_${name} NAMES lib${name}.a)
  if(DDPRUN_STATIC_LIB_${name})
    list(APPEND static_archives ${DDPRUN_STATIC_LIB_${name}})
  else()
    list(APPEND static_missing lib${name}.a)
  endif()
endforeach()
find_library(DDPRUN_STATIC_LIB_absl_base NAMES libabsl_base.a)
if(DDPRUN_STATIC_LIB_absl_base)
  get_filename_component(absl_dir ${DDPRUN_STATIC_LIB_absl_base} DIRECTORY)
  file(GLOB absl_archives ${absl_dir}/libabsl_*.a)
  list(APPEND static_archives ${absl_archives})
else()
  list(APPEND static_missing libabsl_*.a)
endif()
if(static_missing)
  # A machine with shared libraries only (tests/gpu's carried folder) still
  # builds; the programs then need those libraries at run time. CI tests
  # what ships, so there it is an error.
  if("$ENV{CI}" STREQUAL "true")
    set(level FATAL_ERROR)
  else()
    set(level WARNING)
  endif()
  message(${level} "DDPRUN_STATIC_TOOLS: no ${static_missing}; ddprun, "
    "ddprun-rendezvous and ddprun-relay link shared libraries instead "
    "(Debian: libgrpc++-dev libprotobuf-dev libabsl-dev libssl-dev "
    "libc-ares-dev libre2-dev zlib1g-dev libzstd-dev hold the archives)")
  return()
endif()
set(DDPRUN_STATIC_TOOLS_ACTIVE ON)

# spdlog's and fmt's compiled parts, with the definitions the project's
# objects were compiled with.
add_library(ddprun_static_spdlog_fmt STATIC
  ${CMAKE_CURRENT_LIST_DIR}/static_tools/spdlog_fmt.cc)
target_compile_definitions(ddprun_static_spdlog_fmt PRIVATE
  $<TARGET_PROPERTY:spdlog::spdlog,INTERFACE_COMPILE_DEFINITIONS>
  $<TARGET_PROPERTY:fmt::fmt,INTERFACE_COMPILE_DEFINITIONS>)
set_target_properties(ddprun_static_spdlog_fmt PROPERTIES
  POSITION_INDEPENDENT_CODE ON)

set(static_script ${CMAKE_BINARY_DIR}/static_tools/libddprun_static_deps.ld)
list(JOIN static_archives " " static_archive_words)
file(GENERATE OUTPUT ${static_script} CONTENT
  "/* The third-party libraries of the DDPRUN_STATIC_TOOLS programs. */\nGROUP ( $<TARGET_FILE:ddprun_static_spdlog_fmt> ${static_archive_words} )\n")

# The project's libraries: their third-party link items apply only to
# programs that are not DDPRUN_STATIC_LINK; those get the GROUP instead, after
# every library of the project (it is in each one's link interface).
set(ddprun_libraries ddprun_common ddprun_metrics ddprun_proto
  ddprun_rendezvous_core ddprun_rendezvous ddprun_relay ddprun_launcher_posix
  ddprun_launcher_agent
  ddprun_launcher ddprun_version)
set(is_static "$<BOOL:$<TARGET_PROPERTY:DDPRUN_STATIC_LINK>>")
foreach(library IN LISTS ddprun_libraries)
  get_target_property(items ${library} INTERFACE_LINK_LIBRARIES)
  if(NOT items)
    set(items)
  endif()
  set(rewritten)
  foreach(item IN LISTS items)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" bare "${item}")
    if(bare IN_LIST ddprun_libraries OR bare STREQUAL "Threads::Threads")
      list(APPEND rewritten "${item}")
    else()
      # The installed CMake package (ddp::ddprun_common, ...) keeps the item
      # as it was.
      list(APPEND rewritten "$<BUILD_INTERFACE:$<$<NOT:${is_static}>:${item}>>"
        "$<INSTALL_INTERFACE:${item}>")
    endif()
  endforeach()
  list(APPEND rewritten "$<BUILD_INTERFACE:$<${is_static}:${static_script}>>")
  set_property(TARGET ${library} PROPERTY INTERFACE_LINK_LIBRARIES "${rewritten}")
  add_dependencies(${library} ddprun_static_spdlog_fmt)
endforeach()

# ddprun_static_program(TARGET): TARGET links statically as above. Its own
# sources still compile with the third-party libraries' definitions.
function(ddprun_static_program target)
  set_target_properties(${target} PROPERTIES DDPRUN_STATIC_LINK ON)
  target_compile_definitions(${target} PRIVATE
    $<TARGET_PROPERTY:spdlog::spdlog,INTERFACE_COMPILE_DEFINITIONS>
    $<TARGET_PROPERTY:fmt::fmt,INTERFACE_COMPILE_DEFINITIONS>)
  target_link_options(${target} PRIVATE -static-libstdc++ -static-libgcc)
  target_link_libraries(${target} PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
endfunction()

foreach(program ddprun ddprun-rendezvous ddprun-relay)
  if(TARGET ${program})
    ddprun_static_program(${program})
  endif()
endforeach()
