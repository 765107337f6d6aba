# The torch extension's sources: what a build at first use compiles (oomflight/_extension.py, SOURCES, lists the same
# names; python.torch_install checks that an installed package holds exactly those). Included by the CMake install
# (cmake/install.cmake) and the pip build (cmake/wheel.cmake), which copy them beside the Python package.
set(OOMFLIGHT_TORCH_EXTENSION_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/oomflight_torch.cpp
    ${CMAKE_CURRENT_LIST_DIR}/trace_tracker.hpp
    ${CMAKE_CURRENT_LIST_DIR}/context_table.hpp
    ${CMAKE_CURRENT_LIST_DIR}/python_stacks.hpp
    ${CMAKE_CURRENT_LIST_DIR}/python_thread.hpp
    ${CMAKE_CURRENT_LIST_DIR}/job_store.hpp)
