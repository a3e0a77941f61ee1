# `cmake --install BUILD --prefix P`: the public headers (P/include/demi/...), one static library per
# module, the demi command, the CMake package (find_package(demi CONFIG) -> demi::demi and the module
# targets demi::core ... demi::train, their dependencies found again) and demi.pc for pkg-config.
include(CMakePackageConfigHelpers)

get_property(demi_modules GLOBAL PROPERTY DEMI_MODULES)
list(TRANSFORM demi_modules PREPEND demi_ OUTPUT_VARIABLE demi_module_targets)

# Headers: every module's, less the test helpers.
foreach(module IN LISTS demi_modules)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/demi/${module} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/demi
          FILES_MATCHING PATTERN "*.h"
          PATTERN "test_util.h" EXCLUDE PATTERN "*_test_util.h" EXCLUDE PATTERN "test_support.h" EXCLUDE)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/demi/demi.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/demi)

set_target_properties(demi PROPERTIES EXPORT_NAME demi)
install(TARGETS demi demi_kernel_params ${demi_module_targets} EXPORT demiTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET demi_tool)
  install(TARGETS demi_tool RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(demi_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/demi)
install(EXPORT demiTargets NAMESPACE demi:: DESTINATION ${demi_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/demiConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/demiConfig.cmake INSTALL_DESTINATION ${demi_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/demiConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)  # 0.x: a minor version may break the API
install(FILES ${PROJECT_BINARY_DIR}/demiConfig.cmake ${PROJECT_BINARY_DIR}/demiConfigVersion.cmake
        DESTINATION ${demi_cmake_dir})

# demi.pc: static libraries, so --libs lists the modules (users first) and what they link.
# The prefix is found from the file's own place, so an installed tree can be moved.
set(demi_pc_libs)
list(REVERSE demi_modules)
foreach(module IN LISTS demi_modules)
  string(APPEND demi_pc_libs " -ldemi_${module}")
endforeach()
file(RELATIVE_PATH demi_pc_up /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
configure_file(${PROJECT_SOURCE_DIR}/cmake/demi.pc.in ${PROJECT_BINARY_DIR}/demi.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/demi.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
