# Every compile goes through ccache when it is installed (scripts/deps.sh installs it), so a
# rebuild, or CI's next run on the same machine, recompiles only what changed. Paths under the
# source tree are hashed relative to it (base_dir) and the build directory is not hashed
# (hash_dir off), so a clone in another folder hits the same cache; the price is that debug
# info may name the folder of the clone that filled the cache. -DVLLMD_CCACHE=OFF, or a
# launcher of one's own (-DCMAKE_CXX_COMPILER_LAUNCHER=...), turns this off.
if(NOT VLLMD_CCACHE OR CMAKE_CXX_COMPILER_LAUNCHER)
  return()
endif()
find_program(VLLMD_CCACHE_PROGRAM ccache)
if(NOT VLLMD_CCACHE_PROGRAM)
  message(STATUS "ccache not found: every build compiles from scratch (apt install ccache)")
  return()
endif()
set(CMAKE_CXX_COMPILER_LAUNCHER env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} CCACHE_NOHASHDIR=1
  ${VLLMD_CCACHE_PROGRAM})
