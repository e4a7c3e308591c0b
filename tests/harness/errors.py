"""Checking error lines: a run refused or ended by an error prints exactly one
`PROGRAM: error: ...` line naming the problem, every rank exits non-zero (the launcher's exit
code), nothing hangs (the launch's timeout) and no output is left behind.
"""
import glob

from harness.launch import PROGRAMS, run


def expect_error(n, args, pattern, outputs=(), exe="spmd"):
    """Runs `exe` on n ranks with `args` and expects it refused: a non-zero exit within 120 s, one
    error line that mentions `pattern`, nothing left at the paths `outputs` (or PATH.tmp.*)."""
    p = run(n, args, expect_ok=False, timeout=120, exe=exe)
    assert p.returncode != 0, f"expected failure, got exit 0 for {args}"
    prefix = PROGRAMS[exe] + ": error:"
    lines = [l for l in p.stderr.splitlines() if prefix in l]
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{p.stderr}"
    assert pattern in lines[0], f"error line does not mention {pattern!r}: {lines[0]}"
    for o in outputs:
        assert not glob.glob(o + "*"), f"{o} was left behind"
    print("ok:", lines[0])


def one_error_line(p, pattern, prefix="spmd_train: error:"):
    """The one `prefix` line of the failed (non-zero) run `p`, which must mention `pattern`."""
    assert p.returncode != 0, f"expected a failure, got exit 0:\n{p.stdout[-2000:]}"
    lines = [l for l in p.stderr.splitlines() if prefix in l]
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{p.stderr[-3000:]}"
    assert pattern in lines[0], f"error line does not mention {pattern!r}: {lines[0]}"
    print("ok:", lines[0])
    return lines[0]
