# demi_module(NAME [USES m...] [PRIVATE_USES m...] [LIBS t...] [PRIVATE_LIBS t...] [TEST_LIBS t...]):
# demi/NAME as its own static library, demi_NAME (demi::NAME), and its *_test.cc files as one test binary
# (which also links PRIVATE_USES and TEST_LIBS).
#
# The layering of DESIGN.md's "may use" table is enforced by include paths. The repository root is no
# include path: each module gets an include root of its own in the build tree,
# build/include/NAME/demi/NAME -> demi/NAME, and a module sees another module's headers only by linking
# it. USES are public (the module's headers include theirs; users of the module see them too);
# PRIVATE_USES only the module's sources see. An include that crosses the table fails to compile.
#
# Files named *_avx2.cc, *_avx512.cc, *_avx512bf16.cc and *_amx.cc are compiled for that ISA only; the rest of the
# library stays portable (no -march=native) and picks a variant at run time (demi/core/cpu.h).
set(DEMI_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(DEMI_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2)
set(DEMI_ISA_FLAGS_avx512bf16 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c -mavx2)
set(DEMI_ISA_FLAGS_amx ${DEMI_ISA_FLAGS_avx512bf16} -mamx-tile -mamx-bf16)

set(DEMI_INCLUDE_ROOTS ${PROJECT_BINARY_DIR}/include)

# build/include/ROOT/PATH -> PATH in the source tree (a symbolic link to a folder or a file).
function(demi_include_link root path)
  set(link ${DEMI_INCLUDE_ROOTS}/${root}/${path})
  get_filename_component(dir ${link} DIRECTORY)
  file(MAKE_DIRECTORY ${dir})
  if(IS_SYMLINK ${link})
    file(READ_SYMLINK ${link} target)
    if(target STREQUAL ${PROJECT_SOURCE_DIR}/${path})
      return()
    endif()
    file(REMOVE ${link})  # left by a source tree that has moved
  endif()
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${path} ${link} SYMBOLIC)
endfunction()

# The flags demi's own targets compile with (warnings, -Werror in CI, sanitizers): never a usage
# requirement of an installed or embedded demi, so they stay off the code of demi's users.
function(demi_own_flags target)
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:demi_warnings>)
endfunction()

function(demi_module name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "USES;PRIVATE_USES;LIBS;PRIVATE_LIBS;TEST_LIBS")
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/demi/${name}/*.cc)
  set(lib_srcs)
  set(test_srcs)
  foreach(src IN LISTS srcs)
    if(src MATCHES "_test\\.cc$")
      list(APPEND test_srcs ${src})
    else()
      list(APPEND lib_srcs ${src})
      foreach(isa avx2 avx512 avx512bf16 amx)
        if(src MATCHES "_${isa}\\.cc$")
          set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${DEMI_ISA_FLAGS_${isa}}")
        endif()
      endforeach()
    endif()
  endforeach()

  demi_include_link(${name} demi/${name})
  add_library(demi_${name} STATIC ${lib_srcs})
  add_library(demi::${name} ALIAS demi_${name})
  set_target_properties(demi_${name} PROPERTIES EXPORT_NAME ${name} POSITION_INDEPENDENT_CODE ON)
  target_compile_features(demi_${name} PUBLIC cxx_std_20)
  target_include_directories(demi_${name} PUBLIC $<BUILD_INTERFACE:${DEMI_INCLUDE_ROOTS}/${name}>
                                                 $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  list(TRANSFORM arg_USES PREPEND demi_ OUTPUT_VARIABLE uses)
  list(TRANSFORM arg_PRIVATE_USES PREPEND demi_ OUTPUT_VARIABLE private_uses)
  target_link_libraries(demi_${name} PUBLIC ${uses} ${arg_LIBS} PRIVATE ${private_uses} ${arg_PRIVATE_LIBS})
  demi_own_flags(demi_${name})
  set_property(GLOBAL APPEND PROPERTY DEMI_MODULES ${name})

  if(DEMI_BUILD_TESTS AND test_srcs)
    # The test sources compile once, into an object library: the sanitizer subsets
    # (cmake/sanitizer_subsets.cmake) link the same objects against their instrumented libraries.
    add_library(demi_${name}_test_objs OBJECT ${test_srcs})
    target_link_libraries(demi_${name}_test_objs PRIVATE demi_${name} ${private_uses} ${arg_TEST_LIBS} GTest::gtest)
    demi_own_flags(demi_${name}_test_objs)
    add_executable(demi_${name}_test $<TARGET_OBJECTS:demi_${name}_test_objs>)
    target_link_libraries(demi_${name}_test PRIVATE demi_${name} ${private_uses} ${arg_TEST_LIBS} GTest::gtest GTest::gtest_main)
    demi_own_flags(demi_${name}_test)
    gtest_discover_tests(demi_${name}_test DISCOVERY_MODE PRE_TEST
                         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                         PROPERTIES LABELS ${name})
  endif()
endfunction()
