# Debian packages, one per component (docs/packaging.md): `cmake --build build --target debs`
# writes build/packages/<package>_<version>_<arch>.deb from the build tree as it is.
#   kprof-agent       kprof-agent, libkprof_inject.so, kprof-run and its Python hook
#   kprof-collectord  kprof-collectord and the schema's migrations
#   kprof-analyzer    kprof-analyzer
#   kprofctl          kprofctl and kprof-analyze
# Included last by the top-level CMakeLists.txt (CPack reads the install rules of the whole tree).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kprof)
set(CPACK_PACKAGE_VENDOR "kprof")
set(KPROF_DEB_MAINTAINER "kprof maintainers <kprof-maintainers@example.org>" CACHE STRING
    "Maintainer field of the Debian packages")
set(CPACK_PACKAGE_CONTACT "${KPROF_DEB_MAINTAINER}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
# DESTDIR staging, so the install rules see CMAKE_INSTALL_PREFIX=/usr (packaging/CMakeLists.txt
# puts /etc/kprof and /lib/systemd/system by it).
set(CPACK_SET_DESTDIR ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL agent collectord analyzer kprofctl)
set(CPACK_DEB_COMPONENT_INSTALL ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)

set(KP_DEB_agent_NAME kprof-agent)
set(KP_DEB_agent_UNIT kprof-agent.service)
set(KP_DEB_agent_SUMMARY "kprof node agent, capture library and kprof-run")
set(KP_DEB_agent_TEXT
    "The node daemon that training processes started with kprof-run connect to. It\nstreams their captured CUDA, NVTX and Python activity to kprof-collectord.")
set(KP_DEB_collectord_NAME kprof-collectord)
set(KP_DEB_collectord_UNIT kprof-collectord.service)
set(KP_DEB_collectord_SUMMARY "kprof collector: ingest and capture control")
set(KP_DEB_collectord_TEXT
    "Takes the agents' captured events and kprofctl's capture commands and writes\nthem to PostgreSQL. Ships the schema's migrations.")
set(KP_DEB_analyzer_NAME kprof-analyzer)
set(KP_DEB_analyzer_UNIT kprof-analyzer.service)
set(KP_DEB_analyzer_SUMMARY "kprof analyzer: views of captured runs")
set(KP_DEB_analyzer_TEXT
    "Answers kprofctl's breakdowns, operator, kernel and distributed views from the\nruns in PostgreSQL.")
set(KP_DEB_kprofctl_NAME kprofctl)
set(KP_DEB_kprofctl_UNIT "")
set(KP_DEB_kprofctl_SUMMARY "kprof command line: captures and analyses")
set(KP_DEB_kprofctl_TEXT
    "Starts and follows captures of training jobs and shows their analyses.\nkprof-analyze analyses trace files offline.")

# Debian's changelog of a native package (/usr/share/doc/<package>/changelog.gz), one entry
# for this version, dated by the last commit when there is one (reproducible builds).
set(KP_DEB_CHANGELOG ${CMAKE_BINARY_DIR}/packaging/debian/changelog.gz)
set(kp_date "")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} log -1 --format=%cD WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
                  OUTPUT_VARIABLE kp_date OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(kp_date STREQUAL "")
  set(kp_date "Thu, 01 Jan 2026 00:00:00 +0000")
endif()
file(WRITE ${CMAKE_BINARY_DIR}/packaging/debian/changelog
     "kprof (${PROJECT_VERSION}) unstable; urgency=medium\n\n  * Release ${PROJECT_VERSION}.\n\n -- ${KPROF_DEB_MAINTAINER}  ${kp_date}\n")
execute_process(COMMAND gzip -9nf ${CMAKE_BINARY_DIR}/packaging/debian/changelog RESULT_VARIABLE kp_rc)
if(NOT kp_rc EQUAL 0)
  message(FATAL_ERROR "gzip failed on packaging/debian/changelog")
endif()

foreach(c ${CPACK_COMPONENTS_ALL})
  string(TOUPPER ${c} C)
  set(pkg ${KP_DEB_${c}_NAME})
  set(CPACK_DEBIAN_${C}_PACKAGE_NAME ${pkg})
  set(CPACK_DEBIAN_${C}_FILE_NAME DEB-DEFAULT)
  set(CPACK_COMPONENT_${C}_DESCRIPTION "${KP_DEB_${c}_SUMMARY}\n${KP_DEB_${c}_TEXT}")
  set(CPACK_DEBIAN_${C}_DESCRIPTION "${KP_DEB_${c}_SUMMARY}\n${KP_DEB_${c}_TEXT}")
  file(WRITE ${CMAKE_BINARY_DIR}/packaging/debian/${c}/conffiles "/etc/kprof/${pkg}.conf\n")
  set(extra ${CMAKE_BINARY_DIR}/packaging/debian/${c}/conffiles)
  install(FILES ${CMAKE_CURRENT_SOURCE_DIR}/packaging/debian/copyright ${KP_DEB_CHANGELOG}
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${pkg} COMPONENT ${c})
  if(NOT KP_DEB_${c}_UNIT STREQUAL "")
    set(KP_PACKAGE ${pkg})
    set(KP_UNIT ${KP_DEB_${c}_UNIT})
    set(KP_UNIT_CONF ${pkg}.conf)
    if(c STREQUAL "agent")
      set(KP_AGENT 1)
    else()
      set(KP_AGENT 0)
    endif()
    foreach(s postinst prerm postrm)
      configure_file(${CMAKE_CURRENT_SOURCE_DIR}/packaging/debian/${s}.in
                     ${CMAKE_BINARY_DIR}/packaging/debian/${c}/${s} @ONLY
                     FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                                      GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
      list(APPEND extra ${CMAKE_BINARY_DIR}/packaging/debian/${c}/${s})
    endforeach()
    # adduser for the system user; systemd's helpers are used when present.
    set(CPACK_DEBIAN_${C}_PACKAGE_DEPENDS "adduser")
  endif()
  set(CPACK_DEBIAN_${C}_PACKAGE_CONTROL_EXTRA "${extra}")
endforeach()

include(CPack)
cpack_add_component(agent DISPLAY_NAME kprof-agent DESCRIPTION "${CPACK_COMPONENT_AGENT_DESCRIPTION}")
cpack_add_component(collectord DISPLAY_NAME kprof-collectord
                    DESCRIPTION "${CPACK_COMPONENT_COLLECTORD_DESCRIPTION}")
cpack_add_component(analyzer DISPLAY_NAME kprof-analyzer
                    DESCRIPTION "${CPACK_COMPONENT_ANALYZER_DESCRIPTION}")
cpack_add_component(kprofctl DISPLAY_NAME kprofctl DESCRIPTION "${CPACK_COMPONENT_KPROFCTL_DESCRIPTION}")

# The packages from the build tree as it is: builds the binaries, then runs cpack.
add_custom_target(debs
  COMMAND ${CMAKE_CPACK_COMMAND} --config ${CMAKE_BINARY_DIR}/CPackConfig.cmake -G DEB
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${CMAKE_BINARY_DIR}/packages/_CPack_Packages
  WORKING_DIRECTORY ${CMAKE_BINARY_DIR}
  COMMENT "Debian packages in ${CMAKE_BINARY_DIR}/packages"
  USES_TERMINAL)
add_dependencies(debs kprof-agent kprof_inject kprof-collectord kprof-analyzer kprofctl kprof-analyze)
