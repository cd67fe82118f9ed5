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
target_link_libraries(onnx_conformance PRIVATE kiln kiln_testutil)

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
		--backend so-im2col --backend so-winograd --backend so-direct
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

# The CUDA backend without a GPU (docs/CUDA.md).  cuda_nvrtc_check prints
# models as CUDA C and compiles them with NVRTC for sm_80 and sm_90
# (warnings fail it): every 3rd conformance case and every .kir test graph
# (all of them: `cuda_nvrtc_check <build>/onnx_node_tests/node`, about a
# minute of CPU), and the real models (ResNet-18, MobileNetV2, the
# transformer block); it reports itself skipped (77) in a build without
# the CUDA toolkit.  onnx_conformance_cuda_emu runs
# every 3rd conformance case through the cuda-emu target (the same CUDA C
# compiled for this CPU) against ONNX's outputs; `onnx_conformance DIR
# --backend cuda-emu` runs them all (about 3 minutes on two cores).
add_executable(cuda_nvrtc_check ${CMAKE_SOURCE_DIR}/tests/onnx/cuda_nvrtc_check.c)
target_link_libraries(cuda_nvrtc_check PRIVATE kiln kiln_testutil)
add_test(NAME cuda_nvrtc_conformance
	COMMAND cuda_nvrtc_check --every 3 ${ONNX_NODE_DIR}/node ${CMAKE_SOURCE_DIR}/tests/kir)
set_tests_properties(cuda_nvrtc_conformance PROPERTIES FIXTURES_REQUIRED onnx_node_data
	SKIP_RETURN_CODE 77 TIMEOUT 900)
add_test(NAME cuda_nvrtc_real_models
	COMMAND cuda_nvrtc_check ${CMAKE_BINARY_DIR}/onnx_real)
set_tests_properties(cuda_nvrtc_real_models PROPERTIES FIXTURES_REQUIRED onnx_real
	SKIP_RETURN_CODE 77 TIMEOUT 900)
# ResNet-18's training step (batch 2, SGD momentum) and eval program
# through NVRTC: 451 launches, the largest training program checked.
add_test(NAME cuda_nvrtc_train_resnet18
	COMMAND cuda_nvrtc_check --train 2 ${CMAKE_BINARY_DIR}/onnx_real/resnet18.onnx)
set_tests_properties(cuda_nvrtc_train_resnet18 PROPERTIES FIXTURES_REQUIRED onnx_real
	SKIP_RETURN_CODE 77 TIMEOUT 900)
add_test(NAME onnx_conformance_cuda_emu
	COMMAND onnx_conformance ${ONNX_NODE_DIR}/node --backend cuda-emu --every 3
		--expected ${CMAKE_SOURCE_DIR}/tests/onnx/expected_failures.txt)
set_tests_properties(onnx_conformance_cuda_emu PROPERTIES FIXTURES_REQUIRED onnx_node_data
	ENVIRONMENT "CK_FORK=no" TIMEOUT 600)
