dsv3_script_test(bench_cli ${CMAKE_CURRENT_LIST_DIR}/test_bench.sh)
