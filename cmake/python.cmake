# python.cmake: the Python package's tests (python/tests, pytest).
#
#   python_pytest  the kiln package (python/kiln: ctypes over kiln.h) on this
#                  build's libkiln.so (kiln_shared, through $KILN_LIBRARY):
#                  ResNet-18 from its nn.Module against PyTorch, the digits
#                  MLP trained through TrainStep to >= 95%, checkpoints,
#                  int8, errors, the ctypes struct layouts against kiln.h.
#                  Run by .venv/bin/python (scripts/setup-venv.sh), which sees
#                  Debian's pytest, numpy, torch (--system-site-packages);
#                  skipped (77) without .venv, pytest or libkiln.so.
#
# Registered only in builds without sanitizers: an ASan-instrumented
# libkiln.so loads into python only with libasan preloaded (LD_PRELOAD),
# and python's own allocations would then be reported as leaks.
if(KILN_SANITIZE)
	message(STATUS "python_pytest not registered: a sanitizer build's libkiln.so does not load into python")
	return()
endif()
set(KILN_PY_VENV ${CMAKE_SOURCE_DIR}/.venv/bin/python)
add_test(NAME python_pytest COMMAND sh -c
	"if [ ! -x '${KILN_PY_VENV}' ]; then echo 'skipped: no .venv (run scripts/setup-venv.sh)'; exit 77; fi; \
if ! '${KILN_PY_VENV}' -c 'import pytest' 2>/dev/null; then echo 'skipped: no pytest (python3-pytest: run scripts/install-deps.sh)'; exit 77; fi; \
if [ ! -f '$<TARGET_FILE:kiln_shared>' ]; then echo 'skipped: no $<TARGET_FILE:kiln_shared>'; exit 77; fi; \
cd '${CMAKE_SOURCE_DIR}' && KILN_LIBRARY='$<TARGET_FILE:kiln_shared>' PYTHONDONTWRITEBYTECODE=1 \
exec '${KILN_PY_VENV}' -m pytest -q -rs -p no:cacheprovider python/tests")
set_tests_properties(python_pytest PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
