"""mpi_scripts/slurm_hostfile.py: SLURM_TASKS_PER_NODE (Slurm's compressed form, aligned with the
node list) into a hostfile, as compare.sbatch writes it."""
import os
import subprocess
import sys
import unittest

import slurm_hostfile as sh

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'mpi_scripts', 'slurm_hostfile.py')


class Expand(unittest.TestCase):
    def test_forms(self):
        self.assertEqual(sh.expand_tasks_per_node("3"), [3])
        self.assertEqual(sh.expand_tasks_per_node("2(x3)"), [2, 2, 2])
        self.assertEqual(sh.expand_tasks_per_node("2(x3),1"), [2, 2, 2, 1])
        self.assertEqual(sh.expand_tasks_per_node("1,4(x2),2"), [1, 4, 4, 2])
        self.assertEqual(sh.expand_tasks_per_node(" 8(x2)\n"), [8, 8])

    def test_bad(self):
        for bad in ("", "x", "2(x)", "2(3)", "0", "2(x0)", "2,,1", "-1", "2(x3"):
            with self.assertRaises(ValueError, msg=bad):
                sh.expand_tasks_per_node(bad)


class Lines(unittest.TestCase):
    def test_both_flavors(self):
        hosts = ["n1", "n2", "n3"]
        self.assertEqual(sh.hostfile_lines(hosts, "2(x2),1", "openmpi"), ["n1 slots=2", "n2 slots=2", "n3 slots=1"])
        self.assertEqual(sh.hostfile_lines(hosts, "2(x2),1", "mpich"), ["n1:2", "n2:2", "n3:1"])

    def test_counts_must_match_the_nodes(self):
        with self.assertRaisesRegex(ValueError, "gives 2 nodes but the node list has 3"):
            sh.hostfile_lines(["a", "b", "c"], "2(x2)", "openmpi")
        with self.assertRaisesRegex(ValueError, "unknown MPI flavor"):
            sh.hostfile_lines(["a"], "1", "intel")


class Command(unittest.TestCase):
    def run_script(self, stdin, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], input=stdin, capture_output=True, text=True)

    def test_writes_the_hostfile(self):
        r = self.run_script("node1\nnode2\n", "openmpi", "3,1")
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "node1 slots=3\nnode2 slots=1\n", ""))

    def test_error_is_one_line(self):
        r = self.run_script("node1\n", "mpich", "2(x2)")
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn("slurm_hostfile.py: error:", r.stderr)


if __name__ == "__main__":
    unittest.main()
