# Tests of src/io and the checkpoint tools (convert, cast-bf16, synth, info).
set(IO_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
dsv3_unit_test(io_golden ${IO_TEST_DIR}/test_io_golden.c ${IO_TEST_DIR}/manifest.c ${IO_TEST_DIR}/sha256.c)
dsv3_unit_test(io_safetensors ${IO_TEST_DIR}/test_io_safetensors.c)
dsv3_unit_test(io_config ${IO_TEST_DIR}/test_io_config.c)
dsv3_unit_test(io_ckpt ${IO_TEST_DIR}/test_io_ckpt.c)
dsv3_unit_test(io_tools ${IO_TEST_DIR}/test_io_tools.c)
