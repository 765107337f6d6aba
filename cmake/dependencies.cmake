# What oomflight builds against, found quietly so that a machine missing several packages gets ONE error naming
# all of them and the Debian packages that provide them, not CMake's first "Could not find a package" of many (a
# `pip install ./python` prints only the end of CMake's output). The names are Debian 12's (scripts/bootstrap.sh
# installs them); elsewhere the error says which CMake package to point at (<Name>_ROOT).
set(_oomflight_missing "")
set(_oomflight_debian "")
macro(_oomflight_need found what debian)
  if(NOT ${found})
    list(APPEND _oomflight_missing "${what}")
    list(APPEND _oomflight_debian ${debian})
  endif()
endmacro()

find_package(MPI QUIET COMPONENTS C)
_oomflight_need(MPI_C_FOUND "MPI (mpicc and its library)" "libopenmpi-dev;openmpi-bin")
# Parallel HDF5, found the portable way: FindHDF5 asks the compiler wrapper (h5pcc) first when told to prefer
# the parallel build, and says whether what it found is parallel.
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 QUIET COMPONENTS C)
if(HDF5_FOUND AND NOT HDF5_IS_PARALLEL)
  list(APPEND _oomflight_missing "parallel HDF5 (the HDF5 found, ${HDF5_C_LIBRARIES}, is serial)")
  list(APPEND _oomflight_debian libhdf5-openmpi-dev)
else()
  _oomflight_need(HDF5_FOUND "parallel HDF5 (MPI-IO)" libhdf5-openmpi-dev)
endif()
find_package(fmt QUIET)
_oomflight_need(fmt_FOUND "fmt" libfmt-dev)
find_package(spdlog QUIET)
_oomflight_need(spdlog_FOUND "spdlog" libspdlog-dev)
find_package(CLI11 QUIET)
_oomflight_need(CLI11_FOUND "CLI11" libcli11-dev)
find_package(nlohmann_json 3 QUIET)
_oomflight_need(nlohmann_json_FOUND "nlohmann-json (3.x)" nlohmann-json3-dev)
find_package(Threads REQUIRED)

if(_oomflight_missing)
  list(JOIN _oomflight_missing ", " _what)
  list(REMOVE_DUPLICATES _oomflight_debian)
  list(JOIN _oomflight_debian " " _packages)
  message(FATAL_ERROR "oomflight cannot be built here: missing ${_what}. On Debian or Ubuntu: "
                      "apt-get install ${_packages}. Elsewhere, install them and point CMake at each with "
                      "<Package>_ROOT (HDF5_ROOT at a parallel build, MPI_HOME at the MPI).")
endif()
