# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
#
# The ROS 2 wheels on PyPI are built in a manylinux image, and their exported
# <pkg>::<pkg>__rosidl_generator_py targets name that image's Python and NumPy include
# directories (/opt/python/cp311-cp311/...). CMake refuses an imported target whose include
# directory does not exist, so an interface package that depends on them (sensor_msgs, action_msgs)
# cannot be generated in a venv. orin_llm_node_replace_missing_python_includes() swaps each such
# missing directory for the ones this build found (Python3_INCLUDE_DIRS,
# Python3_NumPy_INCLUDE_DIRS, set by rosidl_generator_py), in this build only: nothing installed
# is rewritten. Where every directory exists (a system ROS 2 install) it changes nothing.

function(orin_llm_node_replace_missing_python_includes)
  get_directory_property(_targets IMPORTED_TARGETS)
  foreach(_target IN LISTS _targets)
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT _dirs)
      continue()
    endif()
    set(_fixed "")
    set(_changed FALSE)
    foreach(_dir IN LISTS _dirs)
      if(_dir MATCHES "^\\$<" OR EXISTS "${_dir}")
        list(APPEND _fixed "${_dir}")
      elseif(_dir MATCHES "/numpy/")
        list(APPEND _fixed ${Python3_NumPy_INCLUDE_DIRS})
        set(_changed TRUE)
      elseif(_dir MATCHES "/include/python[0-9.]+$")
        list(APPEND _fixed ${Python3_INCLUDE_DIRS})
        set(_changed TRUE)
      else()
        # Not a Python directory: left for CMake to report.
        list(APPEND _fixed "${_dir}")
      endif()
    endforeach()
    if(_changed)
      list(REMOVE_DUPLICATES _fixed)
      set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_fixed}")
      message(STATUS "${_target}: missing Python/NumPy include directories replaced by ${_fixed}")
    endif()
  endforeach()
endfunction()

# rosidl_generator_py exports our Python library with the NumPy include directory it found. In a
# venv inside the checkout (make venv) that directory lies in the source tree, which CMake refuses
# in an installed export: such a directory is kept for this build only ($<BUILD_INTERFACE:...>).
function(orin_llm_node_keep_source_tree_includes_local target)
  if(NOT TARGET ${target})
    return()  # Humble's rosidl names it <package>__python
  endif()
  get_target_property(_dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT _dirs)
    return()
  endif()
  set(_fixed "")
  foreach(_dir IN LISTS _dirs)
    cmake_path(IS_PREFIX CMAKE_SOURCE_DIR "${_dir}" NORMALIZE _in_source)
    if(_in_source AND NOT _dir MATCHES "^\\$<")
      list(APPEND _fixed "$<BUILD_INTERFACE:${_dir}>")
    else()
      list(APPEND _fixed "${_dir}")
    endif()
  endforeach()
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_fixed}")
endfunction()
