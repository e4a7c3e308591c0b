"""mpi_scripts/env.sh's functions of the simulator scripts (pwm_sim_args, pwm_sim_binaries,
pwm_sim_workdir), run in bash: the flags each script takes, the errors and their exit codes."""
import os
import subprocess
import tempfile
import unittest

ENV_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'mpi_scripts', 'env.sh')


def bash(script, *args, env=None):
    """Runs SCRIPT after sourcing env.sh with ARGS as "$@"; (exit code, stdout, stderr)."""
    r = subprocess.run(['bash', '-c', f'source "{ENV_SH}"\n{script}', 'sim_x.sh', *args], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    return r.returncode, r.stdout, r.stderr


SHOW = 'echo "$QUICK $HOSTS $DCN_RATE [$DCN_DELAY] $OUT $PROFILE"'


class SimArgs(unittest.TestCase):
    def test_defaults(self):
        self.assertEqual(bash(f'OUT=o PROFILE=p; pwm_sim_args 2,3 1 "$@"; {SHOW}'), (0, '0 1 200mbit [] o p\n', ''))

    def test_every_flag(self):
        code, out, _ = bash(f'OUT=o PROFILE=p; pwm_sim_args 2,3 1 "$@"; {SHOW}',
                            '--quick', '--no-hosts', '--dcn-rate', '1gbit', '--dcn-delay', '5ms', '--out', 'x/y', '--profile', 'q.json')
        self.assertEqual((code, out), (0, '1 0 1gbit [5ms] x/y q.json\n'))

    def test_profile_only_where_taken(self):
        code, out, err = bash(f'OUT=o; pwm_sim_args 2,3 0 "$@"; {SHOW}', '--profile', 'q.json')
        self.assertEqual((code, out), (2, ''))
        self.assertEqual(err, "sim_x.sh: error: unknown argument '--profile' (see --help)\n")

    def test_unknown_argument(self):
        code, out, err = bash('pwm_sim_args 2,3 1 "$@"; echo parsed', '--quick', '--bogus')
        self.assertEqual((code, out), (2, ''))
        self.assertIn("unknown argument '--bogus'", err)


class SimBinaries(unittest.TestCase):
    def test_present_and_missing(self):
        with tempfile.TemporaryDirectory() as b:
            os.makedirs(os.path.join(b, 'sim'))
            os.makedirs(os.path.join(b, 'spmd'))
            for exe in ('sim/pwm_sim', 'spmd/spmd_train'):
                with open(os.path.join(b, exe), 'w') as f:
                    f.write('#!/bin/sh\n')
                os.chmod(os.path.join(b, exe), 0o755)
            env = {'PWM_SIM_BUILD': b}
            self.assertEqual(bash('pwm_sim_binaries spmd/spmd_train sim/pwm_sim; echo "$B"', env=env), (0, b + '\n', ''))
            code, out, err = bash('pwm_sim_binaries spmd/spmd_train bench/pathways/dispatch_bench sim/pwm_sim; echo ok', env=env)
            self.assertEqual((code, out), (1, ''))
            self.assertEqual(err, f'sim_x.sh: error: {b}/bench/pathways/dispatch_bench is missing: '
                                  f'ninja -C {b} spmd_train dispatch_bench pwm_sim_cli\n')


class SimWorkdir(unittest.TestCase):
    def test_removed_at_exit_and_kept_on_request(self):
        with tempfile.TemporaryDirectory() as d:
            keep = os.path.join(d, 'keep')
            code, out, _ = bash('pwm_sim_workdir; echo 1 >"$W/probes"; echo "$W"', env={'PWM_SIM_KEEP': keep})
            self.assertEqual(code, 0)
            self.assertFalse(os.path.exists(out.strip()))
            with open(os.path.join(keep, 'probes')) as f:
                self.assertEqual(f.read(), '1\n')
            code, out, _ = bash('pwm_sim_workdir; echo "$W"', env={'PWM_SIM_KEEP': ''})
            self.assertEqual(code, 0)
            self.assertFalse(os.path.exists(out.strip()))


if __name__ == '__main__':
    unittest.main()
