# Thin driver over CMake: `make demo` and `make test` are the quick start.
# Each installs missing Debian packages through scripts/install-deps.sh.
# `make install PREFIX=P` builds an optimised tree (build-release) and installs it.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
RELEASE_BUILD ?= build-release
PREFIX ?= /usr/local

.PHONY: all deps build build-asan demo test test-fast install clean

all: build

deps:
	@bash scripts/install-deps.sh
	@bash scripts/setup-venv.sh || echo "make: no ONNX Runtime venv; its interop tests will be skipped"

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Debug

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)

demo: build
	bash examples/demo.sh $(BUILD)

# The plain build, then the same tests under ASan+UBSan.
test: build build-asan
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# An optimised build (no build type: CMakeLists.txt's default,
# RelWithDebInfo) of what is installed, not the tests, installed under
# PREFIX (docs/ARCHITECTURE.md, "Installing").
install:
	@KILN_DEPS=build bash scripts/install-deps.sh
	test -f $(RELEASE_BUILD)/CMakeCache.txt || cmake -S . -B $(RELEASE_BUILD)
	cmake --build $(RELEASE_BUILD) -j $(JOBS) --target kiln_cli kiln kiln_shared kilnrt_gen
	cmake --install $(RELEASE_BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(RELEASE_BUILD)
