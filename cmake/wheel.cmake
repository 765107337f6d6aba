# What a Python build (`pip install ./python`: scikit-build-core, python/pyproject.toml) installs into the package's
# own folder, site-packages/oomflight (wheel.install-dir): bin/oomflight, which the `oomflight` console script
# (oomflight/_command.py) runs; lib/liboomflight.so, which the package loads first (oomflight/_capi.py); the NCCL
# profiler plugin beside it (plugins/nccl's own rule), the torch extension (plugins/pytorch/extension.cmake) and the
# extension's sources, for a build at first use against a torch installed later. No headers, CMake package or
# pkg-config file: C and C++ users install with CMake (cmake/install.cmake).
if(TARGET oomflight)
  install(TARGETS oomflight LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(TARGETS oomflight_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
include(${PROJECT_SOURCE_DIR}/plugins/pytorch/sources.cmake)
install(FILES ${OOMFLIGHT_TORCH_EXTENSION_SOURCES} DESTINATION _torch_plugin)
