# The public API (include/dsv3.h) as an embedding program calls it.
dsv3_unit_test(test_api ${CMAKE_CURRENT_LIST_DIR}/test_api.c)
set_tests_properties(test_api PROPERTIES LABELS api TIMEOUT 120)
