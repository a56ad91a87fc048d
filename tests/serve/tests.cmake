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
  # End to end. Under the sanitizers the load test (concurrency, clients that
  # leave, malformed bodies) and the openai client run in the suite's ASan pass
  # (70-160 s each on a loaded 2-core machine); the curl test (~400 s there:
  # several servers, a queue of long requests) and Chromium's page are
  # labelled slow, to be run by hand:
  #   DSV3_BIN=build-asan/dsv3 tests/serve/serve_curl.sh
  foreach(t curl openai load page)
    dsv3_script_test(serve_${t} ${SERVE_TESTS}/serve_${t}.sh)
    set(labels serve)
    if(DSV3_SANITIZE AND t MATCHES "curl|page")
      set(labels "serve;slow")
    endif()
    set_tests_properties(serve_${t} PROPERTIES LABELS "${labels}" TIMEOUT 300 SKIP_RETURN_CODE 77)
  endforeach()
  if(DSV3_SANITIZE) # half the requests: 4 disconnecting, 2 malformed still
    set_property(TEST serve_load APPEND PROPERTY ENVIRONMENT SERVE_LOAD_REQUESTS=40)
  endif()
endif()
