# The programs: what a node needs to run jobs (component "runtime"), and
# the MNIST example (component "mnist").
foreach(program ddprun ddprun-rendezvous ddprun-relay ddprun-mnist)
  if(TARGET ${program})
    # ddprun-mnist links libddp.so; find it next to the binaries in any
    # prefix (a temp prefix in the tests, /usr in the package).
    set_target_properties(${program} PROPERTIES
      INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
    # The launcher's programs need no LibTorch (component "runtime");
    # ddprun-mnist, a LibTorch program, is an example of its own ("mnist").
    if(program STREQUAL "ddprun-mnist")
      set(component mnist)
    else()
      set(component runtime)
    endif()
    install(TARGETS ${program}
      RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${component})
  endif()
endforeach()
