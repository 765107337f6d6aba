# The installable package: the library, its public headers, the `oomflight` command, a CMake package
# (find_package(oomflight) -> oomflight::oomflight, with a version file) and oomflight.pc. Both package files are
# relocatable: `cmake --install build --prefix ANYWHERE` works.
include(CMakePackageConfigHelpers)

set(OOMFLIGHT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/oomflight)
install(TARGETS oomflight EXPORT oomflightTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS oomflight_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT oomflightTargets NAMESPACE oomflight:: DESTINATION ${OOMFLIGHT_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/oomflightConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/oomflightConfig.cmake INSTALL_DESTINATION ${OOMFLIGHT_CMAKE_DIR})
# 0.x: minor versions may break the API, so a consumer asking for 0.1 accepts 0.1.x only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/oomflightConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/oomflightConfig.cmake ${PROJECT_BINARY_DIR}/oomflightConfigVersion.cmake
        DESTINATION ${OOMFLIGHT_CMAKE_DIR})

# pkg-config: ${pcfiledir} makes the prefix follow the file wherever it is installed.
file(RELATIVE_PATH OOMFLIGHT_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(${CMAKE_CURRENT_LIST_DIR}/oomflight.pc.in ${PROJECT_BINARY_DIR}/oomflight.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/oomflight.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The Python package (and the torch extension's sources it builds at first use), where `oomflight run` finds it:
# PREFIX/share/oomflight/python. `pip install ./python` is the other way in.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/oomflight DESTINATION ${CMAKE_INSTALL_DATADIR}/oomflight/python
        PATTERN "__pycache__" EXCLUDE PATTERN ".gitignore" EXCLUDE PATTERN "_torch_plugin" EXCLUDE)
include(${PROJECT_SOURCE_DIR}/plugins/pytorch/sources.cmake)
install(FILES ${OOMFLIGHT_TORCH_EXTENSION_SOURCES} DESTINATION ${CMAKE_INSTALL_DATADIR}/oomflight/python/oomflight/_torch_plugin)
