# Tests of tensor parallelism over MPI (src/dist/): registered only in an MPI
# build (-DDSV3_MPI=ON). Each runs mpirun with 2 or 4 ranks on this machine
# (oversubscribed, one OpenMP thread per rank); see tests/dist/dist_test.sh.
if(DSV3_MPI)
  set(DIST_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
  add_executable(dist_check ${DIST_TEST_DIR}/dist_check.c)
  target_link_libraries(dist_check PRIVATE dsv3lib)
  foreach(mode comm logits_golden logits_synth greedy load_errors kill_rank hang_timeout)
    add_test(NAME dist_${mode} COMMAND bash ${DIST_TEST_DIR}/dist_test.sh ${mode})
    set_tests_properties(dist_${mode} PROPERTIES
      ENVIRONMENT "DSV3_GOLDEN=${DSV3_GOLDEN};DSV3_BIN=$<TARGET_FILE:dsv3>;DIST_CHECK=$<TARGET_FILE:dist_check>;MPIEXEC=${MPIEXEC_EXECUTABLE}"
      LABELS "dist" PROCESSORS 4 RESOURCE_LOCK mpi TIMEOUT 300)
  endforeach()
endif()
