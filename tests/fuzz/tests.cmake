# Fuzzing the safetensors header parser.
#   libFuzzer (needs clang):  CC=clang cmake -B build-fuzz -DDSV3_FUZZ=ON
#                             cmake --build build-fuzz --target fuzz_safetensors
#                             build-fuzz/tests/fuzz_safetensors -max_total_time=60 CORPUS_DIR
# Without DSV3_FUZZ the same file builds as a plain driver that replays a corpus
# and random mutations; ctest runs 20000 of them (a few seconds).
set(FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
if(DSV3_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DSV3_FUZZ needs clang: CC=clang cmake -B build-fuzz -DDSV3_FUZZ=ON")
  endif()
  # The parser's sources are compiled into the target so that they carry the
  # fuzzer's coverage instrumentation (the rest of libdsv3 is not needed).
  add_executable(fuzz_safetensors ${FUZZ_DIR}/fuzz_safetensors.c ${PROJECT_SOURCE_DIR}/src/io/safetensors.c
                 ${PROJECT_SOURCE_DIR}/src/base/strmap.c ${PROJECT_SOURCE_DIR}/src/base/status.c
                 ${PROJECT_SOURCE_DIR}/src/base/rng.c)
  target_include_directories(fuzz_safetensors PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(fuzz_safetensors PRIVATE DSV3_LIBFUZZER=1)
  target_compile_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer)
  target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_safetensors PRIVATE PkgConfig::JANSSON m)
else()
  add_executable(fuzz_safetensors ${FUZZ_DIR}/fuzz_safetensors.c)
  target_link_libraries(fuzz_safetensors PRIVATE dsv3lib)
  add_test(NAME io_fuzz_safetensors COMMAND fuzz_safetensors --mutations 20000)
endif()
