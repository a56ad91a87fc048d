dsv3_unit_test(model_fp8_kernels ${CMAKE_CURRENT_LIST_DIR}/test_fp8_kernels.c)
dsv3_unit_test(model_golden ${CMAKE_CURRENT_LIST_DIR}/test_golden.c ${CMAKE_CURRENT_LIST_DIR}/golden_run.c
               ${CMAKE_CURRENT_LIST_DIR}/pick_check.c)
dsv3_unit_test(model_variants ${CMAKE_CURRENT_LIST_DIR}/test_variants.c)
# the same passes with every scratch buffer filled with NaN bytes: no reader relies on
# what it did not write (the fast backend hands scratch out unfilled)
foreach(t model_golden model_variants)
  add_test(NAME ${t}_nan_scratch COMMAND ${t} --poison-scratch)
  set_tests_properties(${t}_nan_scratch PROPERTIES
    ENVIRONMENT "DSV3_GOLDEN=${DSV3_GOLDEN};DSV3_BIN=$<TARGET_FILE:dsv3>;DSV3_TESTS=${DSV3_TESTS};${DSV3_TEST_ENV}")
endforeach()
# prefill passes of any length in the expanded attention form (the generic
# mla_attend's, backend/fallback.c; by default from 384 tokens, longer than the
# golden sequences)
add_test(NAME model_golden_expanded COMMAND model_golden --expand-min 1)
set_tests_properties(model_golden_expanded PROPERTIES
  ENVIRONMENT "DSV3_GOLDEN=${DSV3_GOLDEN};DSV3_BIN=$<TARGET_FILE:dsv3>;DSV3_TESTS=${DSV3_TESTS};${DSV3_TEST_ENV}")
# the golden logits through the AVX2 kernels (what CPUs without AVX-512 run)
add_test(NAME model_golden_avx2 COMMAND model_golden --cpu-isa avx2)
set_tests_properties(model_golden_avx2 PROPERTIES
  ENVIRONMENT "DSV3_GOLDEN=${DSV3_GOLDEN};DSV3_BIN=$<TARGET_FILE:dsv3>;DSV3_TESTS=${DSV3_TESTS};${DSV3_TEST_ENV}")
dsv3_unit_test(model_bad_input ${CMAKE_CURRENT_LIST_DIR}/test_bad_input.c)
dsv3_unit_test(model_sampler ${CMAKE_CURRENT_LIST_DIR}/test_sampler.c)
dsv3_script_test(model_nonfinite ${CMAKE_CURRENT_LIST_DIR}/test_nonfinite.sh)
