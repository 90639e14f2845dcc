# The Python wheel: `pip install ./python` (scikit-build-core, python/pyproject.toml) configures this project with
# SKBUILD set, builds the target gnsilu and installs the component "python" alone into the wheel, so these rules
# are all it gets (the `cmake --install` rules of cmake/GnsiluInstall.cmake are in other components and stay out).
#
# The wheel holds the package python/gnsilu (copied by scikit-build-core) and, next to its _lib.py, the library
# under the name the loader looks for: gnsilu/libgnsilu.so. One plain file, not libgnsilu.so.0.2.0 with symbolic
# links (wheels have none): its SONAME stays libgnsilu.so.0, which does not matter when it is loaded by its path.
#
# Where it finds libnvrtc.so.<major> (libsqlite3.so.0 comes from the system, libcuda.so.1 is dlopen'ed), its
# RUNPATH: the CUDA toolkit it was built against, then the NVRTC of NVIDIA's pip wheels next to the package in
# site-packages (PyTorch's CUDA wheels install them: nvidia/cu13/lib for CUDA 13, nvidia/cuda_nvrtc/lib for CUDA
# 12); after those, LD_LIBRARY_PATH and the ldconfig cache. The install rule copies the build tree's file as it is,
# so the library is linked with that RUNPATH (BUILD_WITH_INSTALL_RPATH): CMake's build-tree RUNPATH would end in an
# empty entry (room it keeps for rewriting it on install), and the loader reads an empty entry as the current
# directory. This build tree is scikit-build-core's own temporary one: nothing else runs from it.
if(CUDAToolkit_VERSION_MAJOR VERSION_GREATER_EQUAL 13)
  set(_gnsilu_pip_nvrtc "$ORIGIN/../nvidia/cu${CUDAToolkit_VERSION_MAJOR}/lib")
else()
  set(_gnsilu_pip_nvrtc "$ORIGIN/../nvidia/cuda_nvrtc/lib")
endif()
set_target_properties(gnsilu PROPERTIES
  BUILD_WITH_INSTALL_RPATH ON
  INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR};${_gnsilu_pip_nvrtc}")
unset(_gnsilu_pip_nvrtc)

install(FILES $<TARGET_FILE:gnsilu>
        DESTINATION gnsilu
        RENAME libgnsilu.so
        PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE
        COMPONENT python)

# The version file, read by gnsilu/__init__.py (in a checkout it reads the repository's VERSION instead).
install(FILES ${PROJECT_SOURCE_DIR}/VERSION DESTINATION gnsilu COMPONENT python)
