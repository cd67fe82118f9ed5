# bench.cmake: benchmark programs, built on request, never run by ctest.
#
# gemm_bench: kiln_sgemm GFLOP/s at 256, 1024 and 2048 (one thread and the
# runtime's pool) and on model shapes, against the measured fp32 peak of one
# core.  The kernel is JIT-compiled by LLVM, so its speed does not depend on
# how this tree is built; use a non-sanitized tree for the harness anyway.
#   cmake --build build --target gemm_bench && build/gemm_bench [threads]
add_executable(gemm_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/bench/gemm_bench.c)
target_link_libraries(gemm_bench PRIVATE kiln)
target_compile_options(gemm_bench PRIVATE -O2)

# gather_bench: the cost of checking Gather's indices in a compiled library
# (the same model emitted with and without its CG_CHECKs, one thread).
#   cmake --build build --target gather_bench && build/gather_bench [rounds]
add_executable(gather_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/bench/gather_bench.c)
target_link_libraries(gather_bench PRIVATE kiln)
target_compile_options(gather_bench PRIVATE -O2)
