# The command line as people type it: flags, short forms, --help/--version,
# one-shot and stdin modes, UTF-8 errors, and the chat REPL driven through tmux
# (Ctrl-C mid-reply, history, /help, a context that overflows), on models/dsv3-mini.
dsv3_script_test(cli_flags ${CMAKE_CURRENT_LIST_DIR}/test_flags.sh)
dsv3_script_test(cli_repl ${CMAKE_CURRENT_LIST_DIR}/test_repl.sh)
set_tests_properties(cli_flags cli_repl PROPERTIES LABELS cli TIMEOUT 300)
