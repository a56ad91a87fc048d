# CUDA backend tests (only with -DDSV3_CUDA=ON). Each program prints
# "skipped: no GPU" and passes when the machine has no CUDA device, so a CUDA
# build's ctest also passes on a CPU-only machine; on the GPU machine
# scripts/gpu_check.sh runs them from a carried build directory.
if(DSV3_CUDA)
  dsv3_unit_test(test_cuda_ops ${CMAKE_CURRENT_LIST_DIR}/test_cuda_ops.c)
  dsv3_unit_test(test_cuda_golden ${CMAKE_CURRENT_LIST_DIR}/test_cuda_golden.c ${DSV3_TESTS}/model/golden_run.c
                 ${DSV3_TESTS}/model/pick_check.c)
  # figures, not a test: scripts/gpu_check.sh runs it
  add_executable(bench_cuda_ops ${CMAKE_CURRENT_LIST_DIR}/bench_cuda_ops.c)
  target_link_libraries(bench_cuda_ops PRIVATE dsv3lib)
endif()
if(DSV3_CUDA)
  # the whole model on the GPU against the measured ceilings (scripts/gpu_check.sh)
  add_executable(bench_cuda_model ${CMAKE_CURRENT_LIST_DIR}/bench_cuda_model.c)
  target_link_libraries(bench_cuda_model PRIVATE dsv3lib)
  # a chain step's cost: launch boundaries against a persistent kernel's grid barriers
  add_executable(bench_cuda_sync ${CMAKE_CURRENT_LIST_DIR}/bench_cuda_sync.cu)
  set_property(TARGET bench_cuda_sync PROPERTY CUDA_ARCHITECTURES ${DSV3_CUDA_ARCH})
endif()
if(DSV3_CUDA AND TARGET CUDA::cupti)
  # kernel timeline of a run, graph nodes included (CUDA_INJECTION64_PATH; scripts/trace_summary.py)
  add_library(cupti_trace MODULE ${CMAKE_CURRENT_LIST_DIR}/cupti_trace.c)
  target_link_libraries(cupti_trace PRIVATE CUDA::cupti)
endif()
