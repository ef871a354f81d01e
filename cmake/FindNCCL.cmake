# NCCL (NVIDIA's libnccl-dev under /usr/local/cuda or the system, or a prefix in
# CMAKE_PREFIX_PATH) as the imported target NCCL::NCCL. The build uses it, and the installed
# fsdp package finds NCCL with it where it is used.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include /usr/include /usr/local/include)
find_library(NCCL_LIBRARY nccl
  HINTS /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
