# OpenBLAS (Debian's libopenblas-dev, conda's openblas, or a prefix in CMAKE_PREFIX_PATH) as
# the imported target OpenBLAS::OpenBLAS: libopenblas and the directory of its cblas.h.
# The build uses it, and the installed fsdp package finds OpenBLAS with it where it is used
# (so the package names no path of the machine it was built on).
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
find_library(OPENBLAS_LIBRARY openblas)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(OpenBLAS REQUIRED_VARS OPENBLAS_LIBRARY CBLAS_INCLUDE_DIR)
if(OpenBLAS_FOUND AND NOT TARGET OpenBLAS::OpenBLAS)
  add_library(OpenBLAS::OpenBLAS UNKNOWN IMPORTED)
  set_target_properties(OpenBLAS::OpenBLAS PROPERTIES IMPORTED_LOCATION "${OPENBLAS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CBLAS_INCLUDE_DIR}")
endif()
