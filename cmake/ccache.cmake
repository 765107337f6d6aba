# Compiles through ccache when it is installed (Debian's ccache; scripts/bootstrap.sh installs it), so that builds of
# the same sources share their objects: CI's two passes (this clone, then a plain clone in another folder), the pip
# builds the tests make (python.torch_install, python.pip_readme) and the fuzz build's reruns. A launcher set by the
# caller (-DCMAKE_CXX_COMPILER_LAUNCHER=..., or the variable in the environment) wins; -DOOMFLIGHT_CCACHE=OFF turns it
# off.
#
# Objects are shared between folders only if what ccache hashes does not name the folder: CCACHE_BASEDIR (the
# deepest folder holding both the sources and the build folder) makes the paths below it relative to the compiler's
# working folder, which are the same in every clone (build/ beside the sources; a pip build's folder beside the
# package when SKBUILD_BUILD_DIR puts it there, as the tests do), and CCACHE_NOHASHDIR leaves the working folder
# out of the hash (it is in the debug information only: an object from another clone names that clone's folder
# there, nothing else). A build folder with no common parent but / shares nothing between clones.
option(OOMFLIGHT_CCACHE "Compile through ccache when it is installed" ON)
if(OOMFLIGHT_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER AND NOT DEFINED ENV{CMAKE_CXX_COMPILER_LAUNCHER})
  find_program(OOMFLIGHT_CCACHE_PROGRAM ccache)
  if(OOMFLIGHT_CCACHE_PROGRAM)
    set(_oomflight_ccache_base ${PROJECT_SOURCE_DIR})
    while(TRUE)
      string(FIND "${PROJECT_BINARY_DIR}/" "${_oomflight_ccache_base}/" _oomflight_at)
      if(_oomflight_at EQUAL 0 OR _oomflight_ccache_base STREQUAL "/")
        break()
      endif()
      get_filename_component(_oomflight_ccache_base ${_oomflight_ccache_base} DIRECTORY)
    endwhile()
    set(_oomflight_launcher ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${_oomflight_ccache_base} CCACHE_NOHASHDIR=1
                            ${OOMFLIGHT_CCACHE_PROGRAM})
    set(CMAKE_C_COMPILER_LAUNCHER ${_oomflight_launcher})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${_oomflight_launcher})
  endif()
endif()
