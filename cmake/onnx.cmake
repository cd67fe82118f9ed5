# onnx.cmake: C bindings for ONNX's protobuf schema, generated at build time.
#
# protoc-c compiles Debian's onnx.proto (libonnx-dev, proto2, package onnx,
# so messages are Onnx__ModelProto etc.) into <build>/onnx_pb/onnx.pb-c.[ch];
# the importer and exporter parse and pack models with protobuf-c through
# those structs and never touch the wire format themselves.
#
# Sets, for the top-level CMakeLists:
#   KILN_ONNX_SRC       the generated .pb-c.c, compiled into libkiln
#   KILN_ONNX_INCLUDES  the folder holding the generated onnx.pb-c.h
#   KILN_ONNX_LIBS      protobuf-c (pkg-config libprotobuf-c), as full paths:
#                       they go into the installed CMake package as they are
#   KILN_ONNX_INC_DIRS  its include folders (usually none but /usr/include)

find_package(PkgConfig REQUIRED)
pkg_check_modules(PROTOBUF_C REQUIRED IMPORTED_TARGET libprotobuf-c)
find_program(PROTOC_C NAMES protoc-c REQUIRED)
find_file(ONNX_PROTO onnx.proto PATHS /usr/include/onnx /usr/local/include/onnx
	NO_DEFAULT_PATH REQUIRED)
get_filename_component(ONNX_PROTO_DIR ${ONNX_PROTO} DIRECTORY)

set(KILN_ONNX_INCLUDES ${CMAKE_BINARY_DIR}/onnx_pb)
set(KILN_ONNX_SRC ${KILN_ONNX_INCLUDES}/onnx.pb-c.c)
set(KILN_ONNX_LIBS ${PROTOBUF_C_LINK_LIBRARIES})
set(KILN_ONNX_INC_DIRS ${PROTOBUF_C_INCLUDE_DIRS})
file(MAKE_DIRECTORY ${KILN_ONNX_INCLUDES})

add_custom_command(
	OUTPUT ${KILN_ONNX_SRC} ${KILN_ONNX_INCLUDES}/onnx.pb-c.h
	COMMAND ${PROTOC_C} --c_out=${KILN_ONNX_INCLUDES} -I${ONNX_PROTO_DIR} ${ONNX_PROTO}
	DEPENDS ${ONNX_PROTO}
	COMMENT "protoc-c: generating C bindings for onnx.proto"
	VERBATIM)
add_custom_target(kiln_onnx_pb DEPENDS ${KILN_ONNX_SRC})

# Generated code: not ours to keep warning-clean.
set_source_files_properties(${KILN_ONNX_SRC} PROPERTIES GENERATED TRUE COMPILE_OPTIONS "-w")
