"""Every script's numbers and lists read one way (env.sh's pwm_value, pwm_count, pwm_decimal,
pwm_words; supervise.sh's own check): a bad value ends the script before anything is installed or
built, with exit code 2 and one line that names the script and the flag, never a shell's text
(issue 59: a 20-digit number printed bash's "integer expression expected" first, and
`supervise.sh --max-restarts 99999999999999999999` restarted forever)."""
import os
import subprocess
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "mpi_scripts")
BIG = "99999999999999999999"

# (script, arguments, environment, words the one line must hold)
CASES = [
    ("compare.sh", ["--np", BIG], {}, ["--np", "out of range", "1 to 4096"]),
    ("compare.sh", ["--steps", "2x"], {}, ["--steps", "whole number"]),
    ("compare.sh", ["--np", "08"], {}, ["--np must be a whole number", "'08'"]),
    ("compare.sh", ["--rounds", "0"], {}, ["--rounds 0 is out of range"]),
    ("compare.sh", ["--moe", "--hosts", "0"], {}, ["--hosts 0 is out of range", "2 to 16"]),
    ("compare.sh", ["--moe-skew", "-1"], {}, ["--moe-skew must be a number from 0", "'-1'"]),
    ("compare.sh", ["--moe-skew", "x"], {}, ["--moe-skew must be a number"]),
    ("compare.sh", ["--np"], {}, ["--np needs a value"]),
    ("compare.sh", ["--palm", "--tcp-eager", "8m"], {}, ["--tcp-eager must be a whole number"]),
    ("compare.sh", ["--tcp-eager", "65536"], {}, ["--tcp-eager needs --palm or --palm-fsdp"]),
    ("failure_bench.sh", ["--steps", BIG], {}, ["--steps", "out of range"]),
    ("failure_bench.sh", ["--models", ""], {}, ["--models is empty"]),
    ("failure_bench.sh", ["--models", "spmd,bogus"], {}, ["--models takes", "'bogus'"]),
    ("failure_bench.sh", ["--faults", ""], {}, ["--faults is empty"]),
    ("failure_bench.sh", ["--mtbf", "0.5"], {}, ["--mtbf must be a number from 1"]),
    ("failure_bench.sh", ["--seed", BIG], {}, ["--seed", "out of range"]),
    ("pipeline_bench.sh", ["--rounds", BIG], {}, ["--rounds", "out of range"]),
    ("pipeline_bench.sh", ["--stages", "1"], {}, ["--stages 1 is out of range", "2 to 64"]),
    ("pipeline_bench.sh", ["--stages", ""], {}, ["--stages is empty"]),
    ("pipeline_bench.sh", ["--micro", "3"], {}, ["--micro takes", "'3'"]),
    ("pipeline_bench.sh", ["--stage-dp", "0"], {}, ["--stage-dp 0 is out of range"]),
    ("pipeline_bench.sh", ["--hosts", "1"], {}, ["--hosts 1 is out of range"]),
    ("straggler_bench.sh", ["--delay", BIG], {}, ["--delay", "out of range"]),
    ("straggler_bench.sh", ["--steps", "3"], {}, ["--steps 3 is out of range", "4 to"]),
    ("scale_bench.sh", ["--rounds", BIG], {}, ["--rounds", "out of range"]),
    ("supervise.sh", ["--max-restarts", BIG, "--", "true"], {}, ["--max-restarts", "whole number from 0"]),
    ("cluster.sh", ["up", "--hosts", BIG], {}, ["--hosts", "out of range", "1 to 16"]),
    ("slurm_cluster.sh", ["run", "--hosts", BIG, "--", "true"], {}, ["--hosts", "out of range", "1 to 16"]),
    ("slurm_cluster.sh", ["run", "--hosts", "2", "--timeout", "1m", "--", "true"], {}, ["--timeout must be a whole number"]),
    ("slurm_cluster.sh", ["run", "--", "true"], {}, ["run needs --hosts K"]),
    ("spmd_bench.sh", [BIG], {}, ["STEPS", "out of range"]),
    ("spmd_bench.sh", [], {"PWM_BENCH_ROUNDS": "0"}, ["PWM_BENCH_ROUNDS 0 is out of range"]),
    ("moe_bench.sh", ["3", "30", "40"], {}, ["WARM (40) must be below STEPS (30)"]),
    ("moe_bench.sh", ["x"], {}, ["ROUNDS must be a whole number"]),
    ("collectives_bench.sh", [BIG], {}, ["NP", "out of range"]),
    ("model_bench.sh", [], {"PWM_BENCH_ROUNDS": BIG}, ["PWM_BENCH_ROUNDS", "out of range"]),
    ("dispatch_bench.sh", [], {"NPS": "3 x"}, ["NPS must be a whole number"]),
    ("dispatch_bench.sh", [], {"HOSTS": BIG}, ["HOSTS", "out of range"]),
]


class ScriptNumbers(unittest.TestCase):
    def test_bad_values_end_in_one_line(self):
        for script, args, env, words in CASES:
            with self.subTest(script=script, args=args, env=env):
                r = subprocess.run(["bash", os.path.join(SCRIPTS, script), *args], capture_output=True, text=True,
                                   timeout=30, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(r.stdout, "")
                lines = r.stderr.splitlines()
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertTrue(lines[0].startswith(f"{script}: error: "), lines[0])
                for w in words:
                    self.assertIn(w, lines[0])
                self.assertNotIn("integer expression", r.stderr)


if __name__ == "__main__":
    unittest.main()
