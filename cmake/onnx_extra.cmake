# onnx_extra.cmake: ONNX export checks, real PyTorch models and fuzzing.
#
# Included from the top CMakeLists after the unit tests are registered.
#   onnx_real_models_gen  exports ResNet-18, MobileNetV2 and a transformer
#                         encoder block from PyTorch into <build>/onnx_real
#                         (tests/onnx/make_real_models.py; cached by a stamp)
#   onnx_real_models      test_onnx_export's real_models case on them: import,
#                         verify, run vs PyTorch (1e-4), import-export-import
#   onnx_export_ort       tests/onnx/check_export.py on what the two tests
#                         above exported into <build>/onnx_export: checker
#                         (full_check) and ONNX Runtime vs kiln's interpreter;
#                         skipped (77) without .venv (scripts/setup-venv.sh)
#   onnx_bench_models_ort tests/onnx/check_bench_models.py: bench/models.py's
#                         SqueezeNet 1.1 and ShuffleNetV2 exported, compiled
#                         by the kiln CLI and run at batch 1 and 3 against
#                         ONNX Runtime (1e-4); skipped (77) without .venv
#   onnx_rnn_models_ort   tests/onnx/check_rnn_models.py: PyTorch LSTM and GRU
#                         sequence classifiers (opsets 13 and 17, fixed
#                         sequence length, dynamic batch) and single RNN /
#                         GRU / LSTM nodes over their attributes, through the
#                         interpreter and compiled, against ONNX Runtime
#                         (1e-4); skipped (77) without .venv
#   onnx_text_models_ort  tests/onnx/check_text_models.py: Hugging Face BERT,
#                         DistilBERT and GPT-2 (2 layers, random weights)
#                         exported at opsets 13 and 17 with dynamic batch
#                         and sequence length, through the interpreter and
#                         compiled at two (N, S), against ONNX Runtime
#                         (1e-4); skipped (77) without .venv or transformers
#   test_compiled_models  (tests/unit) compiles the real models to .so
#                         libraries and compares them with the interpreter;
#                         it reads them from KILN_REAL_MODELS, set here
#   fuzz_onnx_short       a 20 s libFuzzer run of the importer (clang);
#                         tests/fuzz/run_fuzz.sh SECONDS BUILD runs longer ones
set(KILN_ONNX_REAL_DIR ${CMAKE_BINARY_DIR}/onnx_real)
set(KILN_ONNX_EXPORT_DIR ${CMAKE_BINARY_DIR}/onnx_export)
file(MAKE_DIRECTORY ${KILN_ONNX_EXPORT_DIR})

add_test(NAME onnx_real_models_gen
	COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/onnx/make_real_models.py
		${KILN_ONNX_REAL_DIR})
set_tests_properties(onnx_real_models_gen PROPERTIES FIXTURES_SETUP onnx_real
	SKIP_RETURN_CODE 77 TIMEOUT 900)

if(TEST test_onnx_export)
	# the plain run writes the DSL graphs' exports for onnx_export_ort
	set_tests_properties(test_onnx_export PROPERTIES FIXTURES_SETUP onnx_exported)
	add_test(NAME onnx_real_models COMMAND test_onnx_export)
	set_tests_properties(onnx_real_models PROPERTIES
		ENVIRONMENT "CK_FORK=no;CK_RUN_CASE=real_models;KILN_REAL_MODELS=${KILN_ONNX_REAL_DIR}"
		WORKING_DIRECTORY ${CMAKE_BINARY_DIR}
		FIXTURES_REQUIRED onnx_real FIXTURES_SETUP onnx_exported TIMEOUT 1800)
endif()

set(KILN_VENV_PY ${CMAKE_SOURCE_DIR}/.venv/bin/python)
add_test(NAME onnx_export_ort COMMAND sh -c
	"if [ -x '${KILN_VENV_PY}' ]; then exec '${KILN_VENV_PY}' '${CMAKE_SOURCE_DIR}/tests/onnx/check_export.py' '${KILN_ONNX_EXPORT_DIR}'; else echo 'skipped: no onnxruntime (no .venv: run scripts/setup-venv.sh)'; exit 77; fi")
set_tests_properties(onnx_export_ort PROPERTIES SKIP_RETURN_CODE 77
	FIXTURES_REQUIRED onnx_exported TIMEOUT 600)

add_test(NAME onnx_bench_models_ort COMMAND sh -c
	"if [ -x '${KILN_VENV_PY}' ]; then exec '${KILN_VENV_PY}' '${CMAKE_SOURCE_DIR}/tests/onnx/check_bench_models.py' '$<TARGET_FILE:kiln_cli>' '${CMAKE_BINARY_DIR}/onnx_bench_models'; else echo 'skipped: no onnxruntime (no .venv: run scripts/setup-venv.sh)'; exit 77; fi")
set_tests_properties(onnx_bench_models_ort PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)

add_test(NAME onnx_rnn_models_ort COMMAND sh -c
	"if [ -x '${KILN_VENV_PY}' ]; then exec '${KILN_VENV_PY}' '${CMAKE_SOURCE_DIR}/tests/onnx/check_rnn_models.py' '$<TARGET_FILE:kiln_cli>' '${CMAKE_BINARY_DIR}/onnx_rnn_models'; else echo 'skipped: no onnxruntime (no .venv: run scripts/setup-venv.sh)'; exit 77; fi")
set_tests_properties(onnx_rnn_models_ort PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)

add_test(NAME onnx_text_models_ort COMMAND sh -c
	"if [ -x '${KILN_VENV_PY}' ]; then exec '${KILN_VENV_PY}' '${CMAKE_SOURCE_DIR}/tests/onnx/check_text_models.py' '$<TARGET_FILE:kiln_cli>' '${CMAKE_BINARY_DIR}/onnx_text_models'; else echo 'skipped: no onnxruntime (no .venv: run scripts/setup-venv.sh)'; exit 77; fi")
set_tests_properties(onnx_text_models_ort PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)

# The fuzz target must be built by clang (libFuzzer), whatever CMAKE_C_COMPILER
# is, so run_fuzz.sh compiles it; it skips (77) when clang cannot.  It carries
# its own sanitizers, so only the sanitizer build runs it (once per make test).
if(KILN_SANITIZE)
add_test(NAME fuzz_onnx_short
	COMMAND ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzz.sh 20 ${CMAKE_BINARY_DIR})
set_tests_properties(fuzz_onnx_short PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900
	FIXTURES_REQUIRED "onnx_real;onnx_node_data")
endif()

# The real models compiled and run as libraries (tests/unit/test_compiled_models.c);
# without the exports (no torch) it prints SKIPPED for them and still checks the
# DSL examples.
if(TEST test_compiled_models)
	set_tests_properties(test_compiled_models PROPERTIES
		ENVIRONMENT "CK_FORK=no;KILN_REAL_MODELS=${KILN_ONNX_REAL_DIR}"
		FIXTURES_REQUIRED onnx_real TIMEOUT 1800)
endif()

# onnx_qdq_ort  tests/onnx/check_qdq.py: ResNet-18 and MobileNetV2 quantized by
#               ONNX Runtime's quantize_static (QDQ, per-channel) import,
#               compile and agree with ORT's int8 run (.venv and .venv-quant).
add_test(NAME onnx_qdq_ort COMMAND sh -c
	"if [ -x '${KILN_VENV_PY}' ]; then exec '${KILN_VENV_PY}' '${CMAKE_SOURCE_DIR}/tests/onnx/check_qdq.py' '$<TARGET_FILE:kiln_cli>' '${CMAKE_BINARY_DIR}/onnx_qdq'; else echo 'skipped: no onnxruntime (no .venv: run scripts/setup-venv.sh)'; exit 77; fi")
set_tests_properties(onnx_qdq_ort PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
