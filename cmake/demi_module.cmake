# demi_module(NAME): adds demi/NAME's sources to the library and its *_test.cc files to one test binary.
#
# Files named *_avx2.cc, *_avx512.cc and *_avx512bf16.cc are compiled for that ISA only; the rest of the
# library stays portable (no -march=native) and picks a variant at run time (demi/core/cpu.h).
set(DEMI_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(DEMI_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2)
set(DEMI_ISA_FLAGS_avx512bf16 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c -mavx2)

function(demi_module name)
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/demi/${name}/*.cc)
  set(lib_srcs)
  set(test_srcs)
  foreach(src IN LISTS srcs)
    if(src MATCHES "_test\\.cc$")
      list(APPEND test_srcs ${src})
    else()
      list(APPEND lib_srcs ${src})
      foreach(isa avx2 avx512 avx512bf16)
        if(src MATCHES "_${isa}\\.cc$")
          set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${DEMI_ISA_FLAGS_${isa}}")
        endif()
      endforeach()
    endif()
  endforeach()
  target_sources(demi PRIVATE ${lib_srcs})
  if(DEMI_BUILD_TESTS AND test_srcs)
    add_executable(demi_${name}_test ${test_srcs})
    target_link_libraries(demi_${name}_test PRIVATE demi::demi GTest::gtest GTest::gtest_main)
    gtest_discover_tests(demi_${name}_test DISCOVERY_MODE PRE_TEST
                         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                         PROPERTIES LABELS ${name})
  endif()
endfunction()
