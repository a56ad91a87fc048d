# dsv3 serve: unit tests of its pieces, a fuzz target for the request parser,
# and end-to-end tests that run the server on 127.0.0.1 (a free port) with the
# trained model in models/dsv3-mini, driven by curl and by the openai npm
# client (tests/serve/node: `npm ci` there first; skipped without it).
#   libFuzzer:  CC=clang cmake -B build-fuzz -DDSV3_FUZZ=ON
#               cmake --build build-fuzz --target fuzz_request
#               build-fuzz/tests/fuzz_request -max_total_time=60
set(SERVE_TESTS ${CMAKE_CURRENT_LIST_DIR})
if(DSV3_FUZZ)
  add_executable(fuzz_request ${SERVE_TESTS}/fuzz_request.c ${PROJECT_SOURCE_DIR}/src/serve/request.c
                 ${PROJECT_SOURCE_DIR}/src/serve/output.c)
  target_include_directories(fuzz_request PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(fuzz_request PRIVATE DSV3_LIBFUZZER=1)
  target_compile_options(fuzz_request PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer)
  target_link_options(fuzz_request PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_request PRIVATE PkgConfig::JANSSON m)
  set_target_properties(fuzz_request PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
endif()
if(TARGET dsv3serve)
  add_executable(test_serve_unit ${SERVE_TESTS}/test_serve_unit.c ${DSV3_TESTS}/test.c)
  target_include_directories(test_serve_unit PRIVATE ${DSV3_TESTS})
  target_link_libraries(test_serve_unit PRIVATE dsv3serve)
  add_test(NAME serve_unit COMMAND test_serve_unit)
  set_tests_properties(serve_unit PROPERTIES LABELS serve TIMEOUT 60)
  if(NOT DSV3_FUZZ)
    add_executable(fuzz_request ${SERVE_TESTS}/fuzz_request.c)
    target_link_libraries(fuzz_request PRIVATE dsv3serve)
    add_test(NAME serve_fuzz_request COMMAND fuzz_request --mutations 20000)
    set_tests_properties(serve_fuzz_request PROPERTIES LABELS serve TIMEOUT 120)
  endif()
  # End to end; under the sanitizers too (the whole serve set takes under a
  # minute there at -O2).
  foreach(t curl openai load page spec reasoning)
    dsv3_script_test(serve_${t} ${SERVE_TESTS}/serve_${t}.sh)
    set_tests_properties(serve_${t} PROPERTIES LABELS serve TIMEOUT 300 SKIP_RETURN_CODE 77)
  endforeach()
endif()
