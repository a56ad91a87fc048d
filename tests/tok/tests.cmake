# Tokenizer and chat-template tests. They need DeepSeek-V3's tokenizer files
# (scripts/fetch_tokenizer.sh, run on demand, or $DSV3_TOKENIZER) and, for the
# differential tests, Node with `npm ci --prefix tests/tok/node`.
dsv3_unit_test(test_tok_golden ${CMAKE_CURRENT_LIST_DIR}/test_tok_golden.c)
dsv3_unit_test(test_tok_diff ${CMAKE_CURRENT_LIST_DIR}/test_tok_diff.c)
dsv3_unit_test(test_tok_chat ${CMAKE_CURRENT_LIST_DIR}/test_tok_chat.c)
dsv3_unit_test(test_tok_robust ${CMAKE_CURRENT_LIST_DIR}/test_tok_robust.c)
dsv3_script_test(test_tok_cli ${CMAKE_CURRENT_LIST_DIR}/test_tokenize_cli.sh)
set_tests_properties(test_tok_golden test_tok_diff test_tok_chat test_tok_robust test_tok_cli
                     PROPERTIES LABELS tok TIMEOUT 120)
