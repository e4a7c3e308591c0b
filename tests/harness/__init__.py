"""What the Python case files share (tests/*/*_cases.py): each imports from here only, never from
another folder's tests.

    launch.py     launching ranks: the MPI launcher's command and environment (PWM_MPIEXEC*, set
                  by cmake/mpi_launcher.cmake), the trainers in the build directory, BUILD / TMP /
                  ENV of the case, case_main() (the case file's main), jobs of several programs,
                  under supervise.sh or with a stopped rank, a tiny full filesystem, skip code 77
    workloads.py  the tiny model's flags (TINY) and train(): one trainer run, its metrics
    outputs.py    reading outputs: metrics JSON lines and the final report, temporary files left,
                  --trace spans, checkpoints (through read_checkpoint.py)
    compare.py    two runs bitwise equal, or loss curves within RTOL
    errors.py     one error line, a non-zero exit, no hang, nothing left behind
    checks.py     checks that several trainers' cases run (overlap, non-finite steps, MFU)
    read_checkpoint.py  the reader of docs/checkpoint-format.md independent of the C++ one (also a
                  command: `read_checkpoint.py CHECKPOINT [--dump OUT.json]`, run by model_tests)

CTest finds the package through PYTHONPATH=<source>/tests, which pwm_add_python_cases
(tests/CMakeLists.txt) adds to every case's environment. By hand, from the source directory:

    PYTHONPATH=tests python3 tests/spmd/spmd_cases.py CASE BUILD_DIR

(with the MPI test environment: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 as root;
without PWM_MPIEXEC the launcher is OpenMPI's `mpirun --oversubscribe --bind-to none`).

BUILD, TMP and ENV are set per case (case_main, or a case replacing ENV for a while): read them
as launch.TMP, never `from harness.launch import TMP`, which would keep the value at import.
"""
