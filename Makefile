# Thin targets over CMake presets; each runs scripts/setup first (it installs only what is missing).
#   make demo   the main job: build, then train the seed's network and real ones, O0 against O2
#   make test   build and run every test (ctest prints its summary)
#   make bench  build in release mode and run the benchmarks
#   make fresh-check  the two commands above on a brand-new Debian 12 root (scripts/fresh-check)
JOBS ?= $(shell nproc)
PRESET ?= release
CMAKE_FLAGS ?=
ifeq ($(CI),true)
CMAKE_FLAGS += -DDEMI_WERROR=ON
endif

.PHONY: all setup build test demo bench asan tsan fresh-check clean

all: build

setup:
	@scripts/setup

build: setup
	@cmake --preset $(PRESET) $(CMAKE_FLAGS) > /dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS)

# Test processes run side by side; passive OpenMP workers keep them from spinning against each other.
test: build
	@OMP_WAIT_POLICY=PASSIVE ctest --preset $(PRESET) -j $(JOBS)

# The main job builds only what it runs (the library and the demi command), not the tests.
demo: setup
	@cmake --preset $(PRESET) $(CMAKE_FLAGS) > /dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS) --target demi_tool
	@build/$(PRESET)/tools/demi/demi demo

bench:
	@scripts/setup --bench
	@$(MAKE) --no-print-directory build PRESET=release
	@bench/run

fresh-check:
	@scripts/fresh-check

asan:
	@$(MAKE) --no-print-directory test PRESET=asan

tsan:
	@$(MAKE) --no-print-directory test PRESET=tsan

clean:
	rm -rf build
