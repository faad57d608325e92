#!/usr/bin/env bash
# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
#
# Build this package's ROS interfaces (action/Ask.action) into a venv from its rosidl / ament
# wheels (requirements/ros-build.txt): what `colcon build` does on a robot, the interfaces only.
#   tools/venv_interfaces.sh VENV
# Everything is written inside VENV: the build tree (VENV/build/interfaces, kept so that a second
# run only rebuilds what changed), the libraries (VENV/lib, on the LD_LIBRARY_PATH the ROS wheels
# give every venv interpreter), share/ (ament_index, the .action file) and the Python part in
# VENV/lib/orin_llm_node_interfaces/orin_llm_node, which orin_llm_node/__init__.py adds to the
# editable checkout's package path (in site-packages it would hide the checkout).
set -euo pipefail

venv=$(cd "${1:?usage: $0 VENV}" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
python="$venv/bin/python"

# rosidl_generator_py needs CMake 3.20; a machine without it (or with an older one) gets the
# PyPI wheel inside the venv.
cmake_ok() {
    local version
    version=$("$1" --version 2>/dev/null | head -n 1 | awk '{print $3}')
    [[ -n "$version" && "$(printf '3.20\n%s\n' "$version" | sort -V | head -n 1)" == 3.20 ]]
}
cmake=$(command -v cmake || true)
if [[ -z "$cmake" ]] || ! cmake_ok "$cmake"; then
    cmake="$venv/bin/cmake"
    if [[ ! -x "$cmake" ]] || ! cmake_ok "$cmake"; then
        "$python" -m pip install -q --disable-pip-version-check 'cmake>=3.22'
    fi
fi

# The generated type supports are C and C++, linked against the wheels' libstdc++ builds.
for compiler in "${CC:-cc}" "${CXX:-c++}"; do
    if ! command -v "$compiler" >/dev/null; then
        echo "$0: no $compiler: building the ROS interfaces needs a C and a C++ compiler" \
             "(Debian/Ubuntu: apt install build-essential; or set CC and CXX)" >&2
        exit 1
    fi
done

build="$venv/build/interfaces"
mkdir -p "$build"
export AMENT_PREFIX_PATH="$venv"
"$cmake" -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$venv" -DCMAKE_INSTALL_PREFIX="$venv" \
    -DPython3_EXECUTABLE="$python" -DPYTHON_INSTALL_DIR=lib/orin_llm_node_interfaces \
    -DORIN_LLM_NODE_INTERFACES_ONLY=ON -DBUILD_TESTING=OFF >"$build.log" 2>&1 \
    || { tail -n 40 "$build.log" >&2; exit 1; }
"$cmake" --build "$build" --parallel "$(nproc)" >>"$build.log" 2>&1 \
    || { tail -n 40 "$build.log" >&2; exit 1; }
"$cmake" --install "$build" >>"$build.log" 2>&1 || { tail -n 40 "$build.log" >&2; exit 1; }
echo "ROS interfaces built into $venv (log: $build.log)"
