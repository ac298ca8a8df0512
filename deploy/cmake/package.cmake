# CPack: Debian packages, one per install component, split by what they need:
#   ddprun        the launcher: ddprun, ddprun-rendezvous, ddprun-relay,
#                 systemd units, docs, examples (runtime). No LibTorch: with
#                 DDPRUN_STATIC_TOOLS it depends on libc6 alone.
#   libddp-dev    libddp (a static library), its headers, the static helpers
#                 it links and the CMake package, for users' LibTorch
#                 programs (dev): depends on libtorch-dev and the -dev
#                 packages find_package(ddp) looks for
#   ddprun-mnist  the MNIST trainer, an example libddp program (mnist):
#                 LibTorch, gRPC, ...; libddp is linked into it (static), so
#                 it needs ddprun (its launcher), not libddp-dev
#                 (with BUILD_SHARED_LIBS: libddp-dev too, for libddp.so)
# `cpack -G DEB` in the build directory writes <name>_<version>_<arch>.deb
# for each; deploy/package/test_deb_contents.sh checks their Depends and
# files (deploy.deb_contents), deploy/package/test_deb.sh installs them with
# apt (deploy.deb_package, root).
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VENDOR "ddprun")
set(CPACK_PACKAGE_CONTACT "ddprun maintainers <ddprun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "torchrun for C++: rendezvous, node agent and worker library for LibTorch")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
# A component with nothing to install makes no package (no worker: no
# ddprun-mnist).
set(CPACK_COMPONENTS_ALL runtime dev)
if(TARGET ddprun-mnist)
  list(APPEND CPACK_COMPONENTS_ALL mnist)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ddprun)
# Debian's name for a library's development package.
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libddp-dev)
set(CPACK_DEBIAN_MNIST_PACKAGE_NAME ddprun-mnist)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
  "torchrun for C++: the launcher (ddprun), the rendezvous server and the relay")
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "libddp, the worker library, with its headers and CMake package, for LibTorch programs")
set(CPACK_COMPONENT_MNIST_DESCRIPTION
  "ddprun-mnist: the MNIST trainer, an example libddp program")
# Shared-library dependencies are computed by dpkg-shlibdeps from the
# installed ELF files: the launcher's (libc6 alone when it links statically)
# and ddprun-mnist's (LibTorch, gRPC, protobuf, absl, spdlog, ...). Off when
# LibTorch is no Debian package (a zip in /opt, the CUDA image): then the
# other libraries are listed by hand.
option(DDPRUN_DEB_SHLIBDEPS "Compute the .deb's Depends with dpkg-shlibdeps" ON)
# ddprun-mnist is started by ddprun.
set(CPACK_DEBIAN_MNIST_PACKAGE_DEPENDS "ddprun (= ${PROJECT_VERSION})")
if(BUILD_SHARED_LIBS)
  # libddp.so is in libddp-dev (install_library.cmake).
  string(APPEND CPACK_DEBIAN_MNIST_PACKAGE_DEPENDS ", libddp-dev (= ${PROJECT_VERSION})")
endif()
if(DDPRUN_DEB_SHLIBDEPS)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
  set(CPACK_DEBIAN_MNIST_PACKAGE_SHLIBDEPS ON)
else()
  set(shared_deps
    "libgrpc++1.51, libgrpc29, libprotobuf32, libabsl20220623, libspdlog1.10, libfmt9, zlib1g")
  if(NOT DDPRUN_STATIC_TOOLS_ACTIVE)
    set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "${shared_deps}")
  endif()
  string(APPEND CPACK_DEBIAN_MNIST_PACKAGE_DEPENDS ", ${shared_deps}")
  # No libgloo: ddprun's programs use only LibTorch's own Gloo (one Gloo per
  # process), which comes with LibTorch.
endif()
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "ddprun-mnist, slurm-client, python3-torch")
# OpenBLAS makes LibTorch ~10x faster than the reference BLAS (TOOLCHAIN.md).
set(CPACK_DEBIAN_MNIST_PACKAGE_RECOMMENDS "libopenblas0-openmp")
# What find_package(ddp) needs to find (ddpConfig.cmake's find_dependency):
# LibTorch with the headers of the Gloo it links (Debian's CPU or CUDA
# build; each conflicts with the other, so a system holds one Gloo).
set(ddp_dev_depends "libtorch-dev | libtorch-cuda-dev, libgloo-dev | libgloo-cuda-dev, libgrpc++-dev, libprotobuf-dev, protobuf-compiler-grpc, libabsl-dev, libspdlog-dev, cmake")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${ddp_dev_depends}")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
include(CPack)
