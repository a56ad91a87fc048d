# The command line as people type it: flags, short forms, --help/--version,
# one-shot and stdin modes, UTF-8 errors, and the chat REPL driven through tmux
# (Ctrl-C mid-reply, history, /help, a context that overflows), on models/dsv3-mini.
dsv3_script_test(cli_flags ${CMAKE_CURRENT_LIST_DIR}/test_flags.sh)
dsv3_script_test(cli_repl ${CMAKE_CURRENT_LIST_DIR}/test_repl.sh)
set_tests_properties(cli_flags cli_repl PROPERTIES LABELS cli TIMEOUT 300)
add_executable(test_think ${CMAKE_CURRENT_LIST_DIR}/test_think.c ${PROJECT_SOURCE_DIR}/tools/think.c ${DSV3_TESTS}/test.c)
target_include_directories(test_think PRIVATE ${DSV3_TESTS} ${PROJECT_SOURCE_DIR}/tools)
target_link_libraries(test_think PRIVATE dsv3lib)
add_test(NAME cli_think COMMAND test_think)
set_tests_properties(cli_think PROPERTIES LABELS cli TIMEOUT 30)
