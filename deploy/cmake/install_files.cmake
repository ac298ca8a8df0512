# systemd units, docs and the deployment examples, in the GNUInstallDirs
# places (component "runtime").
#
# A unit names its program by absolute path, and that path depends on the
# prefix chosen at install time (`cmake --install --prefix P`, /usr in the
# .deb), so the units are configured when they are installed.
foreach(unit ddprun-rendezvous.service ddprun-agent@.service)
  set(src ${PROJECT_SOURCE_DIR}/deploy/systemd/${unit}.in)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/systemd/${unit})
  install(CODE "
    set(DDPRUN_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
    set(DDPRUN_DOCDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DOCDIR}\")
    configure_file(\"${src}\" \"${out}\" @ONLY)
    file(INSTALL \"${out}\"
      DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${DDPRUN_SYSTEMD_UNIT_DIR}\")
    " COMPONENT runtime)
endforeach()

install(FILES ${PROJECT_SOURCE_DIR}/README.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
# Both are README.md: the deploy map goes beside the examples it describes.
install(FILES ${PROJECT_SOURCE_DIR}/deploy/README.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT runtime)
# The deployment files are examples to copy and edit, not live config.
foreach(dir systemd docker k8s slurm local)
  if(EXISTS ${PROJECT_SOURCE_DIR}/deploy/${dir})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/deploy/${dir}
      DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT runtime
      USE_SOURCE_PERMISSIONS PATTERN "*.in" EXCLUDE)
  endif()
endforeach()

# The Python package workers import (`import ddprun.progress`): the agent
# adds this folder to their PYTHONPATH (launcher/cli/python_module.h).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/ddprun
  DESTINATION ${CMAKE_INSTALL_DATADIR}/ddprun/python COMPONENT runtime
  FILES_MATCHING PATTERN "*.py")
