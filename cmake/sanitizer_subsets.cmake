# The sanitizer subsets that `make test` runs, each a small build of the modules it checks with their own
# tests, in a fraction of a full sanitizer preset's time (the presets asan and tsan cover everything):
#
# - AddressSanitizer + UndefinedBehaviorSanitizer over core (allocator, tensors, conversions), data
#   (IDX/CIFAR/gzip readers, the prefetch thread) and io (safetensors, atomic writes): the modules that
#   parse untrusted input or manage memory by hand.
# - ThreadSanitizer over core (the thread pool) and data (the prefetch thread, map's worker team, the
#   pipeline). libgomp is not instrumented and TSan cannot see its barriers, so this build runs demi's
#   parallel loops on its own std::thread pool (DEMI_STD_THREAD_POOL: the same chunking, every
#   synchronization visible) instead of suppressing reports wholesale; the one test that checks the pool
#   is shared with oneDNN's OpenMP team is filtered out.
#
# The tests themselves are the main build's objects (demi_module's demi_<module>_test_objs), linked against
# the instrumented libraries: what is checked is the library code, and the test sources compile once rather
# than three times (they were a third of a fresh build's compile time). No define of a subset reaches a
# header (DEMI_STD_THREAD_POOL is read in parallel.cc only), so both builds see the same inline code.
#
# demi_sanitizer_subset(NAME FLAGS f... MODULES m... [DEFINES d...] [FILTER gtest-filter])
function(demi_sanitizer_subset name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "FILTER" "FLAGS;MODULES;DEFINES")
  set(lib_srcs)
  set(test_objs)
  set(include_roots)
  foreach(module IN LISTS arg_MODULES)
    list(APPEND include_roots ${DEMI_INCLUDE_ROOTS}/${module})
    file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/demi/${module}/*.cc)
    foreach(src IN LISTS srcs)
      if(NOT src MATCHES "_test\\.cc$")
        list(APPEND lib_srcs ${src})
      endif()
    endforeach()
    list(APPEND test_objs $<TARGET_OBJECTS:demi_${module}_test_objs>)
  endforeach()
  add_library(demi_${name} STATIC ${lib_srcs})
  target_include_directories(demi_${name} PUBLIC ${include_roots})
  target_compile_features(demi_${name} PUBLIC cxx_std_20)
  target_compile_options(demi_${name} PUBLIC ${arg_FLAGS})
  target_compile_definitions(demi_${name} PUBLIC ${arg_DEFINES})
  target_link_options(demi_${name} PUBLIC ${arg_FLAGS})
  # Warnings are checked (and -Werror applied) in the main build; GCC 12 raises false ones at -O1 here.
  target_link_libraries(demi_${name} PUBLIC OpenMP::OpenMP_CXX Threads::Threads ZLIB::ZLIB DNNL::dnnl)
  # ISA-specific sources keep their flags: demi_module set them on these files, in this same directory.
  add_executable(demi_${name}_test ${test_objs})
  target_link_libraries(demi_${name}_test PRIVATE demi_${name} GTest::gtest GTest::gtest_main)
  string(JOIN "_" modules ${arg_MODULES})
  add_test(NAME sanitizers.${name}.${modules} COMMAND demi_${name}_test --gtest_filter=${arg_FILTER})
  set_tests_properties(sanitizers.${name}.${modules} PROPERTIES LABELS sanitizers ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
endfunction()

# The exhaustive and 10^7-random conversion tests are slow under the sanitizers; they run uninstrumented
# in the main suite and are filtered out here.
set(demi_slow_tests "*RandomBitPatterns:*EdgesAndRandom:*EveryTieAndBoundary:ConvertKernels.*EveryPattern")
demi_sanitizer_subset(san FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -O1 -g1
                      MODULES core data io FILTER -${demi_slow_tests})
demi_sanitizer_subset(tsan FLAGS -fsanitize=thread -O1 -g1 MODULES core data DEFINES DEMI_STD_THREAD_POOL
                      FILTER -${demi_slow_tests}:ParallelFor.DemiAndOneDnnShareOneThreadPool)
