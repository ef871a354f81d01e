# cuDNN (its graph API, cudnn_graph.h and libcudnn) as the imported target CUDNN::CUDNN, with
# CUDNN_VERSION read from cudnn_version.h, so that find_package(CUDNN 9...<10) asks for
# cuDNN 9. The build uses it, and the installed fsdp package finds cuDNN with it.
find_path(CUDNN_INCLUDE_DIR cudnn_graph.h
  HINTS /usr/local/cuda/include /usr/include /usr/include/x86_64-linux-gnu)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
  HINTS /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu)
unset(CUDNN_VERSION)
if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_defines
    REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  set(CUDNN_VERSION "")
  foreach(part MAJOR MINOR PATCHLEVEL)
    string(REGEX MATCH "CUDNN_${part} +([0-9]+)" _cudnn_match "${_cudnn_defines}")
    string(APPEND CUDNN_VERSION "${CMAKE_MATCH_1}.")
  endforeach()
  string(REGEX REPLACE "\\.$" "" CUDNN_VERSION "${CUDNN_VERSION}")
  unset(_cudnn_defines)
  unset(_cudnn_match)
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION HANDLE_VERSION_RANGE)
if(CUDNN_FOUND AND NOT TARGET CUDNN::CUDNN)
  add_library(CUDNN::CUDNN UNKNOWN IMPORTED)
  set_target_properties(CUDNN::CUDNN PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
