# train.cmake: `kiln train`'s acceptance runs on sklearn's digits.
#
# Included from the top CMakeLists after the unit tests are registered.
#   train_digits      tests/train/digits.sh: an MLP and a Conv-BN CNN reach
#                     >= 95% test accuracy; stop/kill and resume reproduce
#                     the uninterrupted runs' curves exactly; torn and corrupt
#                     checkpoints are refused; .kir path and CLI errors.
#                     Writes <build>/train_digits (exports, kiln's logits).
#                     Skipped (77) without Debian's python3-sklearn.
#   train_digits_ort  tests/train/check_ort.py: ONNX Runtime's predictions
#                     of the exported MLP and CNN equal kiln's (argmax, and
#                     logits within 1e-4); skipped (77) without .venv
#                     (scripts/setup-venv.sh).
set(KILN_TRAIN_DIR ${CMAKE_BINARY_DIR}/train_digits)
set(KILN_TRAIN_VENV_PY ${CMAKE_SOURCE_DIR}/.venv/bin/python)

add_test(NAME train_digits
	COMMAND sh ${CMAKE_SOURCE_DIR}/tests/train/digits.sh $<TARGET_FILE:kiln_cli> ${KILN_TRAIN_DIR})
set_tests_properties(train_digits PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900
	FIXTURES_SETUP train_digits_out)

add_test(NAME train_digits_ort COMMAND sh -c
	"if [ ! -x '${KILN_TRAIN_VENV_PY}' ]; then echo 'skipped: no onnxruntime (no .venv: run scripts/setup-venv.sh)'; exit 77; fi; \
cd '${KILN_TRAIN_DIR}' && \
'${KILN_TRAIN_VENV_PY}' '${CMAKE_SOURCE_DIR}/tests/train/check_ort.py' mlp.onnx data/test_x.npy mlp_out.npy data/test_y.npy && \
'${KILN_TRAIN_VENV_PY}' '${CMAKE_SOURCE_DIR}/tests/train/check_ort.py' cnn.onnx data/test_img.npy cnn_out.npy data/test_y.npy && \
'${KILN_TRAIN_VENV_PY}' '${CMAKE_SOURCE_DIR}/tests/train/check_ort.py' --int8 cnn.int8.onnx data/test_img.npy cnn_int8_out.npy data/test_y.npy")
set_tests_properties(train_digits_ort PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
	FIXTURES_REQUIRED train_digits_out)

# train_distributed  tests/train/distributed.sh: `kiln train --distributed`
#                    under `mpirun --oversubscribe` (loss parity with one
#                    process for 2 and 4 ranks, the sampler, the CNN,
#                    checkpoints resumed on 1 and 2 ranks, a killed, a hung
#                    and a mismatched rank).  Skipped (77) where CMake found
#                    no MPI (CMakeLists.txt says why at configure time).
#                    Under ASan the ranks run without LeakSanitizer (see
#                    the script: Open MPI's unloaded plugins cannot be
#                    suppressed by name).
if(KILN_HAVE_MPI)
	add_test(NAME train_distributed
		COMMAND sh ${CMAKE_SOURCE_DIR}/tests/train/distributed.sh $<TARGET_FILE:kiln_cli>
			${CMAKE_BINARY_DIR}/train_distributed ${KILN_MPIRUN})
	set_tests_properties(train_distributed PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
else()
	add_test(NAME train_distributed COMMAND sh -c
		"echo 'skipped: MPI not found at configure time (scripts/install-deps.sh installs libopenmpi-dev and openmpi-bin)'; exit 77")
	set_tests_properties(train_distributed PROPERTIES SKIP_RETURN_CODE 77)
endif()
