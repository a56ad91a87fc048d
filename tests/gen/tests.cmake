dsv3_script_test(gen_generate ${CMAKE_CURRENT_LIST_DIR}/test_generate.sh)
