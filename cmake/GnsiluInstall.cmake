# Installation rules: the public headers, libgnsilu.so, the tools, the CMake package (find_package(gnsilu CONFIG)
# giving gnsilu::gnsilu) and CPack. Included at the end of the top-level CMakeLists.txt.
#
# Components: Runtime (libgnsilu.so.0 and libgnsilu.so.0.2.0, the tools) and Development (the libgnsilu.so
# namelink, the headers, the CMake files): `cmake --install build --component Runtime` installs what an
# application needs at run time only.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(GNSILU_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/gnsilu")

# The top-level CMakeLists.txt gives gnsilu $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>; should that line ever
# run before GNUInstallDirs is included, the variable is empty there on a first configure (a cache variable only
# afterwards) and the exported target would have no include folder. Add the entry here when it is missing.
get_target_property(_gnsilu_includes gnsilu INTERFACE_INCLUDE_DIRECTORIES)
if(NOT "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>" IN_LIST _gnsilu_includes)
  set_property(TARGET gnsilu APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES
               "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
endif()
unset(_gnsilu_includes)

# libgnsilu.so needs libnvrtc at run time, and so do the tools (they link the library's objects statically): the
# build tree finds it through the toolkit's library folder in its RUNPATH; the installed files keep that folder
# (CMake would otherwise strip the RUNPATH on install), so they run without LD_LIBRARY_PATH on a machine with the
# toolkit where it was at build time. Elsewhere libnvrtc.so.N must be on the loader path.
set(GNSILU_INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR}")
set(_gnsilu_installed_targets gnsilu)
foreach(tool gnsilu-tune gnsilu-bench)
  if(TARGET ${tool})
    list(APPEND _gnsilu_installed_targets ${tool})
  endif()
endforeach()
set_target_properties(${_gnsilu_installed_targets} PROPERTIES INSTALL_RPATH "${GNSILU_INSTALL_RPATH}")

# ---- headers --------------------------------------------------------------------------------------------------
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/gnsilu/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gnsilu
        COMPONENT Development
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

# ---- the library (libgnsilu.so -> libgnsilu.so.0 -> libgnsilu.so.0.2.0) --------------------------------------
install(TARGETS gnsilu
        EXPORT gnsilu-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime NAMELINK_COMPONENT Development
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime)

# ---- the tools (GNSILU_BUILD_TOOLS) ---------------------------------------------------------------------------
foreach(tool gnsilu-tune gnsilu-bench)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime)
  endif()
endforeach()

# ---- the CMake package: find_package(gnsilu 0.1 CONFIG REQUIRED), target_link_libraries(app PRIVATE gnsilu::gnsilu)
install(EXPORT gnsilu-targets
        NAMESPACE gnsilu::
        FILE gnsilu-targets.cmake
        DESTINATION ${GNSILU_INSTALL_CMAKEDIR}
        COMPONENT Development)
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/gnsilu-config.cmake.in
  ${PROJECT_BINARY_DIR}/gnsilu-config.cmake
  INSTALL_DESTINATION ${GNSILU_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/gnsilu-config-version.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gnsilu-config.cmake ${PROJECT_BINARY_DIR}/gnsilu-config-version.cmake
        DESTINATION ${GNSILU_INSTALL_CMAKEDIR}
        COMPONENT Development)
unset(_gnsilu_installed_targets)

# ---- CPack: `cpack` in the build folder gives gnsilu-VERSION-Linux.tar.gz (and a .deb where dpkg-deb exists) ----
set(CPACK_PACKAGE_NAME gnsilu)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "gnsilu developers")
set(CPACK_PACKAGE_CONTACT "gnsilu developers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_DESCRIPTION "${PROJECT_DESCRIPTION}")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE.txt)
set(CPACK_PACKAGE_FILE_NAME "${CPACK_PACKAGE_NAME}-${CPACK_PACKAGE_VERSION}-${CMAKE_SYSTEM_NAME}")
find_program(GNSILU_DPKG_DEB dpkg-deb)
mark_as_advanced(GNSILU_DPKG_DEB)
if(GNSILU_DPKG_DEB)
  set(CPACK_GENERATOR "TGZ;DEB")
else()
  set(CPACK_GENERATOR "TGZ")
endif()
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "gnsilu developers")
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libsqlite3-0")
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# One package with every component (Runtime and Development); the TGZ unpacks into a gnsilu-VERSION-Linux folder.
include(CPack)
