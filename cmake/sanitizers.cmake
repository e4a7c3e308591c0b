# Sanitizer and fuzzing builds (docs/sanitizers.md; mpi_scripts/sanitize.sh drives them).
#   -DPWM_SANITIZE=address,undefined   ASan + UBSan on every target (build-asan/)
#   -DPWM_SANITIZE=thread              TSan on every target (build-tsan/)
#   -DPWM_FUZZ=ON                      also the libFuzzer binaries of tests/fuzz (clang only;
#                                      every target gets the coverage instrumentation they need)
# Only our code is instrumented: MPI, OpenBLAS and the C++ runtime come from Debian as they are,
# which is why the suppressions in tests/sanitizers/ name only their frames.
set(PWM_SANITIZE "" CACHE STRING "Sanitizers on every target: address,undefined | thread (empty: none)")
option(PWM_FUZZ "Build the libFuzzer targets of tests/fuzz (needs clang)" OFF)

if(PWM_SANITIZE)
  # -g1: line tables for the reports' stacks at a fraction of -g's build time; frame pointers
  # for the fast unwinder the sanitizers use on every malloc.
  add_compile_options(-fsanitize=${PWM_SANITIZE} -fno-omit-frame-pointer -g1)
  # -O1, as the sanitizers' documentation advises: instrumented -O3 costs twice the compile time
  # (measured per file: dispatcher.cc 52.9 -> 23.2 s, worker.cc 45.2 -> 21.9 s of CPU) and CI
  # builds this configuration on every run; the reports need no more than -O1.
  set(CMAKE_CXX_FLAGS_RELEASE "-O1 -DNDEBUG")
  add_link_options(-fsanitize=${PWM_SANITIZE})
  message(STATUS "pathways-mpi: sanitizers ${PWM_SANITIZE}")
endif()

if(PWM_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "pathways-mpi: -DPWM_FUZZ=ON needs clang (libFuzzer): configure with "
            "-DCMAKE_CXX_COMPILER=clang++ (Debian: clang, libclang-rt-14-dev)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
