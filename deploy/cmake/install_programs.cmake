# The programs: what a node needs to run jobs (component "runtime").
foreach(program ddprun ddprun-rendezvous ddprun-relay ddprun-mnist)
  if(TARGET ${program})
    # ddprun-mnist links libddp.so; find it next to the binaries in any
    # prefix (a temp prefix in the tests, /usr in the package).
    set_target_properties(${program} PROPERTIES
      INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
    install(TARGETS ${program}
      RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  endif()
endforeach()
