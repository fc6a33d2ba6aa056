# Hardening for every target (VLLMD_HARDEN, on by default): the flags Debian's
# dpkg-buildflags gives packages with hardening=+all, so that the binaries CPack puts in the
# .deb pass lintian's and hardening-check's checks. Included before the targets are defined:
# CMAKE_POSITION_INDEPENDENT_CODE only applies to targets created after it is set.
#
#   -D_FORTIFY_SOURCE=2           checked variants of the libc string and I/O functions
#   -fstack-protector-strong      canaries in functions with arrays or addressed locals
#   -fstack-clash-protection      stack probes: a large frame cannot jump the guard page
#   -fcf-protection               CET (IBT and shadow stack) markings, on x86 only
#   PIE                           position-independent executables (ASLR of the binary)
#   -Wl,-z,relro -Wl,-z,now       a read-only GOT once the program has started
#   -Wl,--as-needed               no DT_NEEDED for a library nothing uses
#
# Each flag is checked first, so that another compiler or architecture only loses what it
# does not support. _FORTIFY_SOURCE needs optimization (glibc warns without, which -Werror
# turns into an error) and is noisy under AddressSanitizer, which checks the same calls
# itself: it is left out of Debug builds and of the sanitizer and fuzzing builds.

option(VLLMD_HARDEN "Build with hardening flags (FORTIFY, stack protector, PIE, RELRO, BIND_NOW)"
  ON)
if(NOT VLLMD_HARDEN)
  return()
endif()

include(CheckCXXCompilerFlag)
include(CheckLinkerFlag)
include(CheckPIESupported)

set(CMAKE_POSITION_INDEPENDENT_CODE ON)
check_pie_supported(OUTPUT_VARIABLE pie_output LANGUAGES CXX)
if(NOT CMAKE_CXX_LINK_PIE_SUPPORTED)
  message(WARNING "VLLMD_HARDEN: the linker cannot make PIE executables: ${pie_output}")
endif()

foreach(flag -fstack-protector-strong -fstack-clash-protection -fcf-protection)
  string(MAKE_C_IDENTIFIER "VLLMD_HAVE${flag}" have)
  check_cxx_compiler_flag(${flag} ${have})
  if(${have})
    add_compile_options(${flag})
  endif()
endforeach()

if(NOT VLLMD_SANITIZE AND NOT VLLMD_FUZZ)
  # -U first: some toolchains (Ubuntu's) predefine it, and a redefinition would warn.
  add_compile_options("$<$<NOT:$<CONFIG:Debug>>:-U_FORTIFY_SOURCE;-D_FORTIFY_SOURCE=2>")
endif()

foreach(flag -Wl,-z,relro -Wl,-z,now -Wl,--as-needed)
  string(MAKE_C_IDENTIFIER "VLLMD_HAVE${flag}" have)
  check_linker_flag(CXX ${flag} ${have})
  if(${have})
    add_link_options(${flag})
  endif()
endforeach()
