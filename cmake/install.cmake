# install() rules and the exported CMake package (find_package(cpkit)): one export set per
# library, so a consumer of cpkit::optimized alone needs no Eigen.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(cpkit_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/cpkit)
if(TARGET cpkit_reference)
  install(DIRECTORY reference/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  set_target_properties(cpkit_reference PROPERTIES EXPORT_NAME reference)
  install(TARGETS cpkit_reference EXPORT cpkitReferenceTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT cpkitReferenceTargets NAMESPACE cpkit:: DESTINATION ${cpkit_cmake_dir})
endif()
if(TARGET cpkit_optimized)
  install(DIRECTORY optimized/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  set_target_properties(cpkit_optimized PROPERTIES EXPORT_NAME optimized)
  install(TARGETS cpkit_optimized EXPORT cpkitOptimizedTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT cpkitOptimizedTargets NAMESPACE cpkit:: DESTINATION ${cpkit_cmake_dir})
endif()
configure_package_config_file(cmake/cpkitConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/cpkitConfig.cmake INSTALL_DESTINATION ${cpkit_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/cpkitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cpkitConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/cpkitConfigVersion.cmake
        DESTINATION ${cpkit_cmake_dir})
