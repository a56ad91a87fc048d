dsv3_unit_test(model_fp8_kernels ${CMAKE_CURRENT_LIST_DIR}/test_fp8_kernels.c)
dsv3_unit_test(model_golden ${CMAKE_CURRENT_LIST_DIR}/test_golden.c)
dsv3_unit_test(model_variants ${CMAKE_CURRENT_LIST_DIR}/test_variants.c)
dsv3_unit_test(model_bad_input ${CMAKE_CURRENT_LIST_DIR}/test_bad_input.c)
