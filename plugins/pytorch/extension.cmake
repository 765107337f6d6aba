# The torch extension, oomflight._torch_ext, built by a Python build (`pip install --no-build-isolation ./python`
# into an environment that holds torch: the convention of torch extensions, whose build must see the torch they
# will run with) and installed into the package. What torch's own BuildExtension would pass (its headers and
# libraries, its C++ ABI and pybind11 ABI flags, CUDA's headers) comes from the package's _extension.py, which the
# build at first use also follows, so that both builds are one build. An isolated build (plain `pip install`) sees
# no torch and installs the package without it; the extension is then built at first use (docs/pytorch.md).
find_package(Python COMPONENTS Interpreter Development.Module)
if(NOT Python_FOUND)
  message(STATUS "oomflight: no Python headers for ${Python_EXECUTABLE} (python3-dev); the torch extension is built at first use")
  return()
endif()
set(_settings ${CMAKE_CURRENT_BINARY_DIR}/torch_extension_settings.cmake)
execute_process(
  COMMAND ${Python_EXECUTABLE} ${OOMFLIGHT_PYTHON_PACKAGE_DIR}/_extension.py --cmake-settings ${_settings}
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _why ERROR_VARIABLE _why OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_STRIP_TRAILING_WHITESPACE)
if(NOT _rc EQUAL 0)
  message(STATUS "oomflight: not building the torch extension (${_why}); it is built at first use")
  return()
endif()
include(${_settings})
message(STATUS "oomflight: building the torch extension against torch ${OOMFLIGHT_TORCH_VERSION}")

Python_add_library(oomflight_torch_ext MODULE WITH_SOABI ${CMAKE_CURRENT_SOURCE_DIR}/oomflight_torch.cpp)
set_target_properties(oomflight_torch_ext PROPERTIES OUTPUT_NAME _torch_ext CXX_STANDARD 17
                                                     CXX_VISIBILITY_PRESET default)
target_include_directories(oomflight_torch_ext PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_include_directories(oomflight_torch_ext SYSTEM PRIVATE ${OOMFLIGHT_TORCH_INCLUDE_DIRS})
target_compile_definitions(oomflight_torch_ext PRIVATE ${OOMFLIGHT_TORCH_DEFINITIONS})
target_link_directories(oomflight_torch_ext PRIVATE ${OOMFLIGHT_TORCH_LIBRARY_DIRS})
target_link_libraries(oomflight_torch_ext PRIVATE ${OOMFLIGHT_TORCH_LIBRARIES})
install(TARGETS oomflight_torch_ext LIBRARY DESTINATION .)
