# Tokenizer and chat-template tests. They need DeepSeek-V3's tokenizer files
# (scripts/fetch_tokenizer.sh, run on demand, or $DSV3_TOKENIZER) and, for the
# differential tests, Node with `npm ci --prefix tests/tok/node`.
dsv3_unit_test(test_tok_golden ${CMAKE_CURRENT_LIST_DIR}/test_tok_golden.c)
# The differential tests compare with the Node oracles in tests/tok/node: without
# them installed they are skipped (exit 77), saying the command that installs them.
function(dsv3_tok_oracle_test name source pkg)
  add_executable(${name} ${source} ${DSV3_TESTS}/test.c)
  target_include_directories(${name} PRIVATE ${DSV3_TESTS})
  target_link_libraries(${name} PRIVATE dsv3lib)
  add_test(NAME ${name} COMMAND bash ${DSV3_TESTS}/cli/oracle.sh ${DSV3_TESTS}/tok/node ${pkg} $<TARGET_FILE:${name}>)
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77
    ENVIRONMENT "DSV3_GOLDEN=${DSV3_GOLDEN};DSV3_BIN=$<TARGET_FILE:dsv3>;DSV3_TESTS=${DSV3_TESTS};${DSV3_TEST_ENV}")
endfunction()
dsv3_tok_oracle_test(test_tok_diff ${CMAKE_CURRENT_LIST_DIR}/test_tok_diff.c @huggingface/tokenizers)
dsv3_tok_oracle_test(test_tok_chat ${CMAKE_CURRENT_LIST_DIR}/test_tok_chat.c @huggingface/jinja)
dsv3_unit_test(test_tok_robust ${CMAKE_CURRENT_LIST_DIR}/test_tok_robust.c)
dsv3_script_test(test_tok_cli ${CMAKE_CURRENT_LIST_DIR}/test_tokenize_cli.sh)
set_tests_properties(test_tok_golden test_tok_diff test_tok_chat test_tok_robust test_tok_cli
                     PROPERTIES LABELS tok TIMEOUT 120)
