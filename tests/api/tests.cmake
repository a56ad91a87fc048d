# The public API (include/dsv3.h) as an embedding program calls it.
dsv3_unit_test(test_api ${CMAKE_CURRENT_LIST_DIR}/test_api.c)
set_tests_properties(test_api PROPERTIES LABELS api TIMEOUT 120)

# examples/simple.c against the shared library and dsv3.h alone (no internal
# include directory), run on the small trained model in models/dsv3-mini
add_executable(example_simple ${CMAKE_SOURCE_DIR}/examples/simple.c)
target_link_libraries(example_simple PRIVATE dsv3shared)
set_target_properties(example_simple PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
add_test(NAME example_simple COMMAND example_simple ${CMAKE_SOURCE_DIR}/models/dsv3-mini "Tell me about the city.")
set_tests_properties(example_simple PROPERTIES LABELS api TIMEOUT 120 ENVIRONMENT "${DSV3_TEST_ENV}"
                     PASS_REGULAR_EXPRESSION "[A-Za-z]")

# cmake --install into a staging prefix; examples/simple.c built there with
# pkg-config, against libdsv3.so and libdsv3.a, and run
dsv3_script_test(api_install ${CMAKE_CURRENT_LIST_DIR}/test_install.sh)
# A program built as a user builds it (no -fsanitize) cannot load a sanitized
# libdsv3.so, so under DSV3_SANITIZE this packaging test is left to the plain build.
if(DSV3_SANITIZE)
  set_tests_properties(api_install PROPERTIES LABELS "api;slow" TIMEOUT 300)
else()
  set_tests_properties(api_install PROPERTIES LABELS api TIMEOUT 300)
endif()
