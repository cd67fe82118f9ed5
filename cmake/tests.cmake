# tests.cmake: test suites that need more than one Check executable.
#
# ONNX conformance: tests/onnx/gen_node_tests.py generates the ONNX backend
# node tests with python3-onnx's generator into <build>/onnx_node_tests
# (once: a stamp file marks it done), then onnx_conformance imports every
# case, runs it through the interpreter and through a library kiln_compile
# makes of it (the "so" column; about a minute on two cores, ASan build
# included) and compares the outputs.  The test fails on any case that fails
# on a backend but is not in tests/onnx/expected_failures.txt for it.

set(KILN_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with onnx and numpy (Debian's)")
set(ONNX_NODE_DIR ${CMAKE_BINARY_DIR}/onnx_node_tests)
set(ONNX_NODE_STAMP ${ONNX_NODE_DIR}/generated.stamp)

add_executable(onnx_conformance ${CMAKE_SOURCE_DIR}/tests/onnx/run_conformance.c)
target_link_libraries(onnx_conformance PRIVATE kiln)

add_test(NAME onnx_node_tests_generate
	COMMAND sh -c "test -f '${ONNX_NODE_STAMP}' || '${KILN_PYTHON}' \
'${CMAKE_SOURCE_DIR}/tests/onnx/gen_node_tests.py' '${ONNX_NODE_DIR}' '${ONNX_NODE_STAMP}'")
set_tests_properties(onnx_node_tests_generate PROPERTIES FIXTURES_SETUP onnx_node_data)

add_test(NAME onnx_conformance
	COMMAND onnx_conformance ${ONNX_NODE_DIR}/node
		--expected ${CMAKE_SOURCE_DIR}/tests/onnx/expected_failures.txt)
set_tests_properties(onnx_conformance PROPERTIES FIXTURES_REQUIRED onnx_node_data
	ENVIRONMENT "CK_FORK=no" TIMEOUT 900)
# Every conv case with each convolution algorithm forced (kiln_compile's
# conv option): each must match ONNX's expected outputs on its own.
add_test(NAME onnx_conformance_conv
	COMMAND onnx_conformance ${ONNX_NODE_DIR}/node --filter conv
		--backend so-im2col --backend so-winograd
		--expected ${CMAKE_SOURCE_DIR}/tests/onnx/expected_failures.txt)
set_tests_properties(onnx_conformance_conv PROPERTIES FIXTURES_REQUIRED onnx_node_data
	ENVIRONMENT "CK_FORK=no" TIMEOUT 600)

# The layering (docs/ARCHITECTURE.md, "Layers"): no folder includes or calls
# one above it or a sibling; read from the sources and from nm of the
# objects this build made, so it runs after the build like every test.
add_test(NAME layers COMMAND ${KILN_PYTHON} ${CMAKE_SOURCE_DIR}/tests/layers/check_layers.py
	${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
# docs/layers.dot, the picture of the same floors and targets, is written
# by the checker from its own tables, so it cannot drift from what is held.
add_test(NAME layers_dot COMMAND ${KILN_PYTHON} ${CMAKE_SOURCE_DIR}/tests/layers/check_layers.py
	--dot ${CMAKE_SOURCE_DIR}/docs/layers.dot)
