# Fuzz targets: the safetensors header, the checkpoint index, the config
# reader, tokenizer.json loading, the tokenizer's encode on arbitrary bytes,
# and the chat-template engine.
#   libFuzzer (needs clang):  tests/fuzz/run.sh SECONDS   (builds build-fuzz, seeds corpora
#                             from the golden files, runs each target for SECONDS)
# Without DSV3_FUZZ each target builds with fuzz_driver.c as a plain program:
# ctest replays the seeds and the kept crashers, then runs a few thousand
# random mutations (a few seconds; the real check under the sanitizer build).
set(FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
set(FUZZ_TARGETS index config jinja tok_encode tokenizer_json)
if(DSV3_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DSV3_FUZZ needs clang: CC=clang cmake -B build-fuzz -DDSV3_FUZZ=ON")
  endif()
  # The parser's sources are compiled into the target so that they carry the
  # fuzzer's coverage instrumentation (the rest of libdsv3 is not needed).
  add_executable(fuzz_safetensors ${FUZZ_DIR}/fuzz_safetensors.c ${PROJECT_SOURCE_DIR}/src/io/safetensors.c
                 ${PROJECT_SOURCE_DIR}/src/base/strmap.c ${PROJECT_SOURCE_DIR}/src/base/status.c
                 ${PROJECT_SOURCE_DIR}/src/base/rng.c ${PROJECT_SOURCE_DIR}/src/base/file.c)
  target_include_directories(fuzz_safetensors PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(fuzz_safetensors PRIVATE DSV3_LIBFUZZER=1)
  target_compile_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer)
  target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_safetensors PRIVATE PkgConfig::JANSSON m)
  # The other targets need the file, config and tokenizer code: that part of
  # the library, instrumented (the model and backends are not reached).
  set(DSV3_FUZZ_SOURCES ${DSV3_SOURCES})
  list(FILTER DSV3_FUZZ_SOURCES INCLUDE REGEX "src/(base|io|tok)/")
  add_library(dsv3fuzz STATIC ${DSV3_FUZZ_SOURCES})
  target_include_directories(dsv3fuzz PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(dsv3fuzz PRIVATE -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer)
  target_link_libraries(dsv3fuzz PUBLIC PkgConfig::JANSSON PkgConfig::PCRE2 OpenMP::OpenMP_C Threads::Threads m)
  foreach(t ${FUZZ_TARGETS})
    add_executable(fuzz_${t} ${FUZZ_DIR}/fuzz_${t}.c ${FUZZ_DIR}/fuzz_util.c)
    target_compile_definitions(fuzz_${t} PRIVATE DSV3_LIBFUZZER=1
                               DSV3_FUZZ_TOKENIZER="${PROJECT_SOURCE_DIR}/.cache/tokenizer")
    target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer)
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(fuzz_${t} PRIVATE dsv3fuzz)
  endforeach()
else()
  add_executable(fuzz_safetensors ${FUZZ_DIR}/fuzz_safetensors.c)
  target_link_libraries(fuzz_safetensors PRIVATE dsv3lib)
  add_test(NAME io_fuzz_safetensors COMMAND fuzz_safetensors --mutations 20000)
  foreach(t ${FUZZ_TARGETS})
    add_executable(fuzz_${t} ${FUZZ_DIR}/fuzz_${t}.c ${FUZZ_DIR}/fuzz_util.c ${FUZZ_DIR}/fuzz_driver.c)
    target_include_directories(fuzz_${t} PRIVATE ${FUZZ_DIR})
    target_compile_definitions(fuzz_${t} PRIVATE DSV3_FUZZ_TOKENIZER="${PROJECT_SOURCE_DIR}/.cache/tokenizer")
    target_link_libraries(fuzz_${t} PRIVATE dsv3lib)
  endforeach()
  # seeds: the golden files (and a few small tokenizers); crashers/<target>: inputs that once failed
  set(FZ ${FUZZ_DIR}/crashers)
  add_test(NAME fuzz_index COMMAND fuzz_index --mutations 4000
           ${DSV3_GOLDEN}/tiny_hf/model.safetensors.index.json ${DSV3_GOLDEN}/cast_bf16.index.json ${FZ}/index)
  add_test(NAME fuzz_config COMMAND fuzz_config --mutations 6000
           ${DSV3_GOLDEN}/config_tiny.json ${DSV3_GOLDEN}/tiny_hf/config.json ${PROJECT_SOURCE_DIR}/configs ${FZ}/config)
  add_test(NAME fuzz_jinja COMMAND fuzz_jinja --mutations 20000 ${DSV3_TESTS}/tok/templates ${FZ}/jinja)
  add_test(NAME fuzz_tok_encode COMMAND fuzz_tok_encode --mutations 3000 --max-len 4096
           ${DSV3_TESTS}/tok/corpus.txt ${DSV3_GOLDEN}/tokenizer_cases.json ${FZ}/tok_encode)
  add_test(NAME fuzz_tokenizer_json COMMAND fuzz_tokenizer_json --mutations 2000 ${FUZZ_DIR}/seeds/tokenizer_json
           ${FZ}/tokenizer_json)
  set_tests_properties(fuzz_index fuzz_config fuzz_jinja fuzz_tok_encode fuzz_tokenizer_json PROPERTIES
                       LABELS fuzz TIMEOUT 300)
endif()
