# CPack: Debian packages, one per install component.
#   ddprun      the programs, systemd units, docs, examples (runtime)
#   ddprun-dev  libddp and its headers, the static helpers it links and the
#               CMake package, for users' LibTorch programs (dev)
# `cpack -G DEB` in the build directory writes ddprun_<version>_<arch>.deb
# and ddprun-dev_<version>_<arch>.deb; deploy/package/test_deb.sh installs
# them with apt.
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VENDOR "ddprun")
set(CPACK_PACKAGE_CONTACT "ddprun maintainers <ddprun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "torchrun for C++: rendezvous, node agent and worker library for LibTorch")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ddprun)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME ddprun-dev)
# The runtime's shared-library dependencies (libtorch, gRPC, protobuf, absl,
# spdlog, ...) are computed by dpkg-shlibdeps from the installed ELF files.
# Off when LibTorch is no Debian package (a zip in /opt, the CUDA image):
# then the other libraries are listed by hand.
option(DDPRUN_DEB_SHLIBDEPS "Compute the .deb's Depends with dpkg-shlibdeps" ON)
if(DDPRUN_DEB_SHLIBDEPS)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
else()
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS
    "libgrpc++1.51, libgrpc29, libprotobuf32, libabsl20220623, libspdlog1.10, libfmt9, zlib1g, libcpp-httplib0.11")
  # No libgloo: ddprun's programs use only LibTorch's own Gloo (one Gloo per
  # process), which comes with LibTorch.
endif()
# OpenBLAS makes LibTorch ~10x faster than the reference BLAS (TOOLCHAIN.md).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "libopenblas0-openmp")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "slurm-client, python3-torch")
# What find_package(ddp) needs to find (ddpConfig.cmake's find_dependency):
# LibTorch with the headers of the Gloo it links (Debian's CPU or CUDA
# build; each conflicts with the other, so a system holds one Gloo).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "ddprun (= ${PROJECT_VERSION}), libtorch-dev | libtorch-cuda-dev, libgloo-dev | libgloo-cuda-dev, libgrpc++-dev, libprotobuf-dev, protobuf-compiler-grpc, libabsl-dev, libspdlog-dev, cmake")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
include(CPack)
