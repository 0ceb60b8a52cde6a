# install() rules and the exported CMake package (find_package(cpkit)).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(cpkit_installed cpkit_reference)
install(DIRECTORY reference/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET cpkit_optimized)
  list(APPEND cpkit_installed cpkit_optimized)
  install(DIRECTORY optimized/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
install(TARGETS ${cpkit_installed} EXPORT cpkitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set_target_properties(cpkit_reference PROPERTIES EXPORT_NAME reference)
if(TARGET cpkit_optimized)
  set_target_properties(cpkit_optimized PROPERTIES EXPORT_NAME optimized)
endif()
install(EXPORT cpkitTargets NAMESPACE cpkit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cpkit)
configure_package_config_file(cmake/cpkitConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/cpkitConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cpkit)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/cpkitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cpkitConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/cpkitConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cpkit)
