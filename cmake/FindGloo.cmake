# Gloo (Debian's libgloo-dev, or a prefix in CMAKE_PREFIX_PATH) as the imported target
# Gloo::Gloo. Found by header and library, as scripts/setup.sh checks it, whether or not a
# GlooConfig.cmake came with it. The installed fsdp package finds Gloo with it too.
find_path(GLOO_INCLUDE_DIR gloo/config.h)
find_library(GLOO_LIBRARY gloo)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Gloo REQUIRED_VARS GLOO_LIBRARY GLOO_INCLUDE_DIR)
if(Gloo_FOUND AND NOT TARGET Gloo::Gloo)
  add_library(Gloo::Gloo UNKNOWN IMPORTED)
  set_target_properties(Gloo::Gloo PROPERTIES IMPORTED_LOCATION "${GLOO_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${GLOO_INCLUDE_DIR}")
endif()
