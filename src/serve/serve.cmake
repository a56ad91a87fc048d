# dsv3 serve: the HTTP server (src/serve/) on libmicrohttpd, linked into the
# dsv3 tool. libdsv3 does not depend on it; without libmicrohttpd the tool is
# built without the serve command.
pkg_check_modules(MHD IMPORTED_TARGET libmicrohttpd)
if(MHD_FOUND)
  file(GLOB DSV3_SERVE_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.c)
  add_library(dsv3serve STATIC ${DSV3_SERVE_SOURCES})
  target_link_libraries(dsv3serve PUBLIC dsv3lib PkgConfig::MHD)
  target_link_libraries(dsv3 PRIVATE dsv3serve)
else()
  message(WARNING "libmicrohttpd not found (Debian: libmicrohttpd-dev): dsv3 is built without 'serve'")
  set_source_files_properties(${PROJECT_SOURCE_DIR}/tools/cmd_serve.c PROPERTIES HEADER_FILE_ONLY ON)
endif()
