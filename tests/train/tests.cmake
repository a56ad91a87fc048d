# Tests of the trained checkpoint models/dsv3-mini (made by tools/train/train.py):
# the engine's logits against the PyTorch model's, its tokenizer against
# @huggingface/tokenizers (the tok tests' differential test, which needs
# `npm ci --prefix tests/tok/node`), and the CLI on it.
set(DSV3_TRAINED_DIR ${CMAKE_CURRENT_LIST_DIR}/../../models/dsv3-mini)
dsv3_unit_test(train_trained ${CMAKE_CURRENT_LIST_DIR}/test_trained.c)
target_compile_definitions(train_trained PRIVATE DSV3_TRAINED_DIR="${DSV3_TRAINED_DIR}")
add_test(NAME train_tok_diff COMMAND bash ${DSV3_TESTS}/cli/oracle.sh ${DSV3_TESTS}/tok/node @huggingface/tokenizers
         $<TARGET_FILE:test_tok_diff>)
set_tests_properties(train_tok_diff PROPERTIES SKIP_RETURN_CODE 77)
dsv3_script_test(train_cli ${CMAKE_CURRENT_LIST_DIR}/test_trained_cli.sh)
set_tests_properties(train_tok_diff train_cli PROPERTIES
  ENVIRONMENT "DSV3_TOKENIZER=${DSV3_TRAINED_DIR};DSV3_GOLDEN=${DSV3_GOLDEN};DSV3_BIN=$<TARGET_FILE:dsv3>;DSV3_TESTS=${DSV3_TESTS};${DSV3_TEST_ENV}")
set_tests_properties(train_trained train_tok_diff train_cli PROPERTIES LABELS train TIMEOUT 300)
dsv3_script_test(train_perplexity ${CMAKE_CURRENT_LIST_DIR}/test_perplexity.sh)
set_tests_properties(train_perplexity PROPERTIES LABELS train TIMEOUT 300
  ENVIRONMENT "DSV3_TRAINED=${DSV3_TRAINED_DIR};DSV3_BIN=$<TARGET_FILE:dsv3>;${DSV3_TEST_ENV}")
dsv3_script_test(train_convert_mtp ${CMAKE_CURRENT_LIST_DIR}/test_convert_mtp.sh)
set_tests_properties(train_convert_mtp PROPERTIES LABELS train TIMEOUT 300
  ENVIRONMENT "DSV3_TRAINED=${DSV3_TRAINED_DIR};DSV3_BIN=$<TARGET_FILE:dsv3>;${DSV3_TEST_ENV}")
dsv3_unit_test(train_mtp ${CMAKE_CURRENT_LIST_DIR}/test_mtp.c)
target_compile_definitions(train_mtp PRIVATE DSV3_TRAINED_DIR="${DSV3_TRAINED_DIR}")
set_tests_properties(train_mtp PROPERTIES LABELS train TIMEOUT 300)
dsv3_script_test(train_spec_cli ${CMAKE_CURRENT_LIST_DIR}/test_spec_cli.sh)
set_tests_properties(train_spec_cli PROPERTIES LABELS train TIMEOUT 300
  ENVIRONMENT "DSV3_TRAINED=${DSV3_TRAINED_DIR};DSV3_BIN=$<TARGET_FILE:dsv3>;${DSV3_TEST_ENV}")
# The speculative tests run thousands of forward passes: under the sanitizers
# they take minutes (on 2 cores at -O2: train_spec 140 s, train_spec_sample
# past 300 s), so there train_spec_cli (greedy, batched, drafts 1-3) checks
# those paths' memory.
if(NOT DSV3_SANITIZE)
  dsv3_unit_test(train_spec ${CMAKE_CURRENT_LIST_DIR}/test_spec.c)
  target_compile_definitions(train_spec PRIVATE DSV3_TRAINED_DIR="${DSV3_TRAINED_DIR}")
  dsv3_unit_test(train_spec_sample ${CMAKE_CURRENT_LIST_DIR}/test_spec_sample.c)
  target_compile_definitions(train_spec_sample PRIVATE DSV3_TRAINED_DIR="${DSV3_TRAINED_DIR}")
  set_tests_properties(train_spec train_spec_sample PROPERTIES LABELS train TIMEOUT 300)
endif()
