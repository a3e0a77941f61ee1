# The sanitizer subset that `make test` runs: AddressSanitizer + UndefinedBehaviorSanitizer over the
# modules that parse untrusted input or manage memory by hand — core (allocator, tensors, conversions),
# data (IDX/CIFAR/gzip readers, the prefetch thread) and io (safetensors, atomic writes) — with their own
# tests. They depend on nothing above core, so this builds in a fraction of the full asan preset's time;
# the full preset (cmake --preset asan) covers everything.
set(DEMI_SAN_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -O1 -g)
set(san_lib_srcs)
set(san_test_srcs)
foreach(module core data io)
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/demi/${module}/*.cc)
  foreach(src IN LISTS srcs)
    if(src MATCHES "_test\\.cc$")
      list(APPEND san_test_srcs ${src})
    else()
      list(APPEND san_lib_srcs ${src})
    endif()
  endforeach()
endforeach()
add_library(demi_san STATIC ${san_lib_srcs})
target_include_directories(demi_san PUBLIC ${DEMI_INCLUDE_ROOTS}/core ${DEMI_INCLUDE_ROOTS}/data ${DEMI_INCLUDE_ROOTS}/io)
target_compile_features(demi_san PUBLIC cxx_std_20)
target_compile_options(demi_san PUBLIC ${DEMI_SAN_FLAGS})
target_link_options(demi_san PUBLIC -fsanitize=address,undefined)
# Warnings are checked (and -Werror applied) in the main build; GCC 12 raises false ones under ASan at -O1.
target_link_libraries(demi_san PUBLIC OpenMP::OpenMP_CXX Threads::Threads ZLIB::ZLIB DNNL::dnnl)
add_executable(demi_san_test ${san_test_srcs})
target_link_libraries(demi_san_test PRIVATE demi_san GTest::gtest GTest::gtest_main)
# The exhaustive and 10^7-random conversion tests are slow under ASan; they run uninstrumented in the
# main suite and are filtered out here.
add_test(NAME sanitizers.core_data_io
         COMMAND demi_san_test --gtest_filter=-*RandomBitPatterns:*EdgesAndRandom:*EveryTieAndBoundary:ConvertKernels.*EveryPattern)
set_tests_properties(sanitizers.core_data_io PROPERTIES LABELS sanitizers ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
# ISA-specific sources keep their flags in the sanitizer build too.
foreach(src IN LISTS san_lib_srcs)
  foreach(isa avx2 avx512 avx512bf16)
    if(src MATCHES "_${isa}\\.cc$")
      set_source_files_properties(${src} TARGET_DIRECTORY demi_san PROPERTIES COMPILE_OPTIONS "${DEMI_ISA_FLAGS_${isa}}")
    endif()
  endforeach()
endforeach()
