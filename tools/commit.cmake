# Writes OUT (commit.h) with DSV3_COMMIT, the source tree's git commit ("+dirty"
# with uncommitted changes; "unknown" outside git), only when it changed, so
# that an unchanged commit rebuilds nothing.
execute_process(COMMAND git -C ${SRC} rev-parse --short=12 HEAD OUTPUT_VARIABLE commit
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
else()
  execute_process(COMMAND git -C ${SRC} diff --quiet HEAD -- RESULT_VARIABLE dirty ERROR_QUIET)
  if(NOT dirty EQUAL 0)
    set(commit "${commit}+dirty")
  endif()
endif()
set(text "#define DSV3_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
