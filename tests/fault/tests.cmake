# Fault tests of the checkpoint writers and the CLI: full disk, signals,
# concurrent writers, in-place use, closed descriptors, write errors, FIFOs.
set(FAULT_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
dsv3_script_test(fault_txn ${FAULT_TEST_DIR}/test_fault_txn.sh)
dsv3_script_test(fault_inputs ${FAULT_TEST_DIR}/test_fault_inputs.sh)
set_tests_properties(fault_txn fault_inputs PROPERTIES LABELS fault TIMEOUT 300)
