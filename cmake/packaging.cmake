# Installation and the Debian package: `cpack -G DEB` in the build directory produces
# vllmd_<version>_<arch>.deb with the three binaries, the man pages, the systemd unit, the
# shell completion, the example configuration (a conffile: upgrades keep local edits), and
# what Debian policy asks of every package: the copyright file (cmake/packaging/copyright,
# machine-readable) and the changelog (cmake/packaging/changelog) in /usr/share/doc/vllmd,
# and the lintian overrides, each with its reason (cmake/packaging/lintian-overrides).
# tests/integration/packaging/test_deb.py builds it, runs lintian on it and installs it into
# a scratch root.

include(GNUInstallDirs)

set(VLLMD_PACKAGING_DIR ${PROJECT_SOURCE_DIR}/cmake/packaging)

install(TARGETS vllmd vllmctl vllm-ref-engine RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Stripped installs (cpack, CPACK_STRIP_FILES; cmake --install --strip) also lose the .comment
# section (compiler versions) and .note, as dh_strip does; .note.* (the build ID) stays.
install(CODE "
  if(CMAKE_INSTALL_DO_STRIP)
    foreach(binary vllmd vllmctl vllm-ref-engine)
      execute_process(COMMAND \"${CMAKE_STRIP}\" --remove-section=.comment --remove-section=.note
        \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/\${binary}\"
        COMMAND_ERROR_IS_FATAL ANY)
    endforeach()
  endif()")

# Man pages and the changelog, compressed as Debian policy asks (gzip -9n: no name or time
# stamp in the output, which then only depends on the source).
find_program(GZIP_EXECUTABLE gzip REQUIRED)
function(vllmd_compressed source copy)
  add_custom_command(OUTPUT ${copy}.gz
    COMMAND ${CMAKE_COMMAND} -E copy ${source} ${copy}
    COMMAND ${GZIP_EXECUTABLE} -9nf ${copy}
    DEPENDS ${source}
    COMMENT "Compressing ${source}"
    VERBATIM)
endfunction()

set(compressed_pages)
foreach(page vllmctl.1 vllmd.8 vllmd.toml.5 vllm-ref-engine.1)
  set(copy ${PROJECT_BINARY_DIR}/man/${page})
  vllmd_compressed(${PROJECT_SOURCE_DIR}/man/${page} ${copy})
  list(APPEND compressed_pages ${copy}.gz)
  string(REGEX MATCH "[0-9]$" section ${page})
  install(FILES ${copy}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section})
endforeach()
add_custom_target(man_pages ALL DEPENDS ${compressed_pages})

# /usr/share/doc/vllmd: the copyright file as it is, and the changelog, whose latest entry
# must be this version (a new version needs its changelog entry before it configures).
install(FILES ${VLLMD_PACKAGING_DIR}/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})
file(STRINGS ${VLLMD_PACKAGING_DIR}/changelog changelog_head LIMIT_COUNT 1)
if(NOT changelog_head MATCHES "^vllmd \\(([^)]+)\\) ")
  message(FATAL_ERROR "cmake/packaging/changelog: the first line is not a Debian changelog "
    "entry's: '${changelog_head}'")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "cmake/packaging/changelog: the latest entry is for ${CMAKE_MATCH_1}, "
    "the project is ${PROJECT_VERSION}: add an entry for ${PROJECT_VERSION}")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${VLLMD_PACKAGING_DIR}/changelog)
vllmd_compressed(${VLLMD_PACKAGING_DIR}/changelog ${PROJECT_BINARY_DIR}/packaging/changelog)
add_custom_target(changelog ALL DEPENDS ${PROJECT_BINARY_DIR}/packaging/changelog.gz)
install(FILES ${PROJECT_BINARY_DIR}/packaging/changelog.gz DESTINATION ${CMAKE_INSTALL_DOCDIR})

# The tags lintian reports that are deliberately not fixed, each with its reason.
install(FILES ${VLLMD_PACKAGING_DIR}/lintian-overrides
  DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides RENAME vllmd)

# /usr/lib/systemd/system: the same directory as /lib/systemd/system on Debian 12's merged /usr.
install(FILES daemon/vllmd.service DESTINATION lib/systemd/system)
# Shell completion, generated from vllmctl's command line (cmd/vllmctl/CMakeLists.txt).
install(FILES ${CMAKE_BINARY_DIR}/completion/vllmctl.bash
  DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME vllmctl)
install(FILES ${CMAKE_BINARY_DIR}/completion/vllmctl.zsh
  DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions RENAME _vllmctl)
install(FILES ${CMAKE_BINARY_DIR}/completion/vllmctl.fish
  DESTINATION ${CMAKE_INSTALL_DATADIR}/fish/vendor_completions.d)
# vllmd reads /etc/vllmd/vllmd.toml whatever the prefix: an absolute destination.
install(FILES daemon/vllmd.toml DESTINATION /etc/vllmd)

set(VLLMD_PACKAGE_MAINTAINER
  "Seed 332b952e maintainers <maintainers@users.noreply.a-seed-332b952e.example>"
  CACHE STRING "Maintainer field of the Debian package")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME vllmd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT ${VLLMD_PACKAGE_MAINTAINER})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "vLLM weight-synchronization control plane (vllmd, vllmctl)")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# Stripped binaries: the build tree keeps the debug information.
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # vllmd_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_MAINTAINER ${VLLMD_PACKAGE_MAINTAINER})
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The library packages (libpoco*, libzmq5, libsystemd0, libtomlplusplus3, libstdc++6, libc6)
# with the versions the binaries were linked against, from dpkg-shlibdeps (dpkg-dev).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "bash-completion")
# The synopsis is CPACK_PACKAGE_DESCRIPTION_SUMMARY; CPack indents these lines and turns the
# empty one into " .".
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "vllmd serves vLLM's dev-mode weight-sync HTTP routes (init, start, update,
finish with a version, version queries, world size, pause, resume) and
forwards each call to one or many vLLM engine cores over the engine-core
ZeroMQ/msgpack protocol; a drop-in for vLLM's API server on these routes,
managed by systemd (Type=notify).

vllmctl runs the same lifecycle from shell scripts in training jobs, and
vllm-ref-engine is a reference engine with vLLM's weight-update semantics,
for tests without a GPU.")

# The example configuration is a conffile: dpkg keeps an administrator's changes on upgrade.
file(WRITE ${PROJECT_BINARY_DIR}/packaging/conffiles "/etc/vllmd/vllmd.toml\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/packaging/conffiles)

include(CPack)
