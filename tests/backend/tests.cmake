dsv3_unit_test(backend_kernels ${CMAKE_CURRENT_LIST_DIR}/test_kernels.c)
dsv3_unit_test(backend_fallback ${CMAKE_CURRENT_LIST_DIR}/test_fallback.c)
dsv3_unit_test(backend_scratch ${CMAKE_CURRENT_LIST_DIR}/test_scratch.c)
