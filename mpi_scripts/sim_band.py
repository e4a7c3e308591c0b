#!/usr/bin/env python3
"""The band a projection prints instead of one number: the simulator's validation errors
(mpi_scripts/sim_validate.sh's validation.json) carried onto a projected figure.

    sim_band.py VALIDATION_JSON [PREFIX...]     prints the band of the rows named PREFIX* (all rows
                                                without a prefix) as JSON

A row's signed error is e = (predicted - measured) / measured. A figure the simulator projects
would then measure predicted / (1 + e) for a time (a step, us per computation) and
predicted x (1 + e) for a rate (tokens/s, computations/s); over the validation rows e lies in
[e_lo, e_hi] (their least and greatest error), so the projection's band is the figure at both
ends. That is the spread the simulator showed where it could be checked, not a confidence
interval: a projection far outside the validated configurations may miss by more.
Unit-tested in tests/scripts/test_sim_band.py.
"""
import json
import os
import sys


def select(rows, prefixes=None):
    """The rows whose 'config' starts with one of `prefixes` (every row for none or empty)."""
    if not prefixes:
        return list(rows)
    return [r for r in rows if any(r['config'].startswith(p) for p in prefixes)]


def error_band(rows):
    """{'lo', 'hi', 'rows'}: the least and greatest signed error of `rows` (each has 'predicted' and
    'measured', or 'error'). ValueError when there is none."""
    errs = [r['error'] if 'error' in r else (r['predicted'] - r['measured']) / r['measured'] for r in rows]
    if not errs:
        raise ValueError('no validation row to take the band from')
    return {'lo': min(errs), 'hi': max(errs), 'rows': len(errs)}


def time_range(predicted, band):
    """(low, high) a time predicted this way would measure: predicted / (1 + e) over the band."""
    return predicted / (1 + band['hi']), predicted / (1 + band['lo'])


def rate_range(predicted, band):
    """(low, high) a rate (its time's inverse) would measure: predicted x (1 + e) over the band."""
    return predicted * (1 + band['lo']), predicted * (1 + band['hi'])


def ratio_range(predicted, band):
    """(low, high) for a ratio of two figures each predicted within the band (numerator and
    denominator may err at opposite ends): predicted x (1 + e_lo) / (1 + e_hi) and the reverse."""
    return predicted * (1 + band['lo']) / (1 + band['hi']), predicted * (1 + band['hi']) / (1 + band['lo'])


def load_band(path, prefixes=None, fallback=None):
    """The band of validation.json's rows named prefixes* (sim_validate.sh), or when it has none of
    those, of the rows named fallback* (None: every row). ValueError with one line when the file
    has no such row; OSError / json errors propagate for the caller's one line."""
    with open(path) as f:
        rows = json.load(f)['rows']
    chosen = select(rows, prefixes)
    if not chosen and fallback is not None:
        chosen = select(rows, fallback)
    if not chosen:
        raise ValueError(f"{path} has no validation row named {' or '.join(p + '*' for p in prefixes or [''])}: "
                         f"rerun mpi_scripts/sim_validate.sh")
    b = error_band(chosen)
    b['from'] = sorted({r['config'] for r in chosen})
    return b


# The training-step rows of the validation (sim_validate.sh's names).
STEP_ROWS = ['spmd_', 'fused_', 'chained_', 'opbyop_', 'pipeline_', 'static_', 'size_']


def projection_args(prog, argv):
    """(build, profile, outdir, validation) of a projection's command line, BUILD_DIR PROFILE
    [OUTDIR] [--validation FILE] (sim/project.py, sim/project_moe.py); the validation file
    defaults to OUTDIR/validation.json. Exits with one line on a bad command line."""
    args = list(argv)
    validation = None
    if '--validation' in args:
        i = args.index('--validation')
        if i + 1 >= len(args):
            sys.exit(f"{prog}: error: --validation needs a file (sim_validate.sh's validation.json)")
        validation = args[i + 1]
        del args[i:i + 2]
    if len(args) < 2:
        sys.exit(f'usage: sim/{prog} BUILD_DIR PROFILE [OUTDIR] [--validation FILE]')
    out = args[2] if len(args) > 2 else 'results/sim'
    return args[0], args[1], out, validation or os.path.join(out, 'validation.json')


def band_text(lo, hi, fmt='{:.3g}'):
    """'LO-HI' with both ends in `fmt`."""
    return f"{fmt.format(lo)}-{fmt.format(hi)}"


def band_note(band):
    """'(band from N validation rows, errors -a% to +b%)'."""
    return f"(band: {band['rows']} validation rows, errors {100 * band['lo']:+.1f}% to {100 * band['hi']:+.1f}%)"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        b = load_band(argv[0], argv[1:] or None)
    except (OSError, ValueError, KeyError) as e:
        print(f"sim_band.py: error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(b))
    return 0


if __name__ == '__main__':
    sys.exit(main())
