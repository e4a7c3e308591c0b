#!/usr/bin/env python3
"""One measurement discipline for every benchmark script (compare.sh, model_bench.sh, spmd_bench.sh,
pipeline_bench.sh, the MoE comparison): how candidates are ordered in rounds, how a ratio is taken
from them, the interval printed beside it and the words that say what the figures support.

This machine's speed moves by 10-25% within a minute, so one run against another proves nothing.
The rules:
  - candidates run in short rounds, interleaved: odd rounds in the given order, even rounds in the
    reverse (ABCD DCBA ABCD ...), so a drift of the machine's speed favours none of them;
  - a ratio is the median of the per-round ratios (each round's candidates ran back to back: a
    round pairs them);
  - beside it, a distribution-free interval for that median: the order statistics
    [x_(k), x_(n+1-k)] of the n per-round ratios, with the largest k whose coverage
    1 - 2 P(Binomial(n, 1/2) < k) is still >= 90% (n = 5: the rounds' min and max, 93.8%; n = 8:
    the 2nd and 7th, 93.0%). Below 5 rounds no k reaches 90%: the min and max are printed with
    the coverage they have (n = 3: 75%, n = 4: 87.5%), one round has no interval;
  - a ratio whose interval contains 1 is "same within noise"; otherwise the direction is stated
    and attributed (attribution(): from the traces the runs wrote);
  - a figure that is another quantile of its launches (the simulator's validation takes the lower
    quartile of dispatch_bench's) gets the same kind of interval (quantile_interval).

Command line (for the shell scripts):
  measure.py order ROUND NAME...          the names in round ROUND's order (1-based)
  measure.py ratio LABEL REF CAND         REF and CAND: comma-separated per-round values of a
                                          higher-is-better figure (tokens/s), paired by position;
                                          prints "LABEL: <ratio text>" (CAND over REF)
Unit-tested in tests/scripts/test_measure.py.
"""
import json
import math
import sys

COVERAGE = 0.90  # the intervals' target coverage


def order(names, rnd):
    """The candidates of round `rnd` (1-based): as given in odd rounds, reversed in even ones."""
    names = list(names)
    return names if rnd % 2 == 1 else names[::-1]


def percentile(v, q):
    """The q-quantile of v (0 <= q <= 1), linear between the order statistics."""
    v = sorted(v)
    if not v:
        raise ValueError("percentile of no values")
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def median(v):
    return percentile(v, 0.5)


def _coverage(n, k):
    """P(x_(k) <= true median <= x_(n+1-k)) for n independent draws: 1 - 2 P(Bin(n, 1/2) < k)."""
    below = sum(math.comb(n, i) for i in range(k)) / 2 ** n
    return 1 - 2 * below


def median_interval(v, coverage=COVERAGE):
    """(lo, hi, achieved coverage) for the median of v, or None for fewer than 2 values.

    The order statistics x_(k), x_(n+1-k) with the largest k (narrowest interval) whose coverage
    is >= `coverage`; when even k = 1 (min and max) falls short, min and max with their coverage.
    """
    n = len(v)
    if n < 2:
        return None
    s = sorted(v)
    k = 1
    while k + 1 <= n // 2 and _coverage(n, k + 1) >= coverage:
        k += 1
    return s[k - 1], s[n - k], _coverage(n, k)


def _below(n, q, j):
    """P(Binomial(n, q) < j): the chance that fewer than j of n draws fall below the q-quantile."""
    return sum(math.comb(n, i) * q ** i * (1 - q) ** (n - i) for i in range(j))


def quantile_interval(v, q, coverage=COVERAGE):
    """(lo, hi, achieved coverage) for the q-quantile of v (0 < q < 1), or None for fewer than 2.

    median_interval's construction for any quantile (q = 0.5 gives the same interval): the order
    statistics x_(j), x_(k) that cover it when j to k - 1 of the n draws fall below it, with each
    tail (P(B < j), P(B >= k), B ~ Binomial(n, q)) at most (1 - coverage) / 2, the interval as
    narrow as that allows; when their coverage falls short, min and max with theirs. For the
    simulator's lower quartile of 11 launches: the minimum and the 6th, 92.4%.
    """
    n = len(v)
    if n < 2:
        return None
    if not 0 < q < 1:
        raise ValueError(f"a quantile is in (0, 1) (got {q})")
    s = sorted(v)
    tail = (1 - coverage) / 2
    j = 1
    while j + 1 <= n and _below(n, q, j + 1) <= tail:
        j += 1
    k = n
    while k - 1 >= 1 and 1 - _below(n, q, k - 1) <= tail:
        k -= 1
    cov = _below(n, q, k) - _below(n, q, j)
    if cov < coverage:
        j, k, cov = 1, n, _below(n, q, n) - _below(n, q, 1)
    return s[j - 1], s[k - 1], cov


class Ratio:
    """A paired ratio: the median of per-round ratios with its interval."""

    def __init__(self, per_round):
        if not per_round:
            raise ValueError("a ratio needs at least one round")
        self.per_round = list(per_round)
        self.median = median(self.per_round)
        iv = median_interval(self.per_round)
        self.lo, self.hi, self.coverage = iv if iv else (None, None, None)

    @property
    def rounds(self):
        return len(self.per_round)

    def same_within_noise(self):
        """True when the interval contains 1; None when there is no interval (one round)."""
        return None if self.lo is None else self.lo <= 1.0 <= self.hi

    def interval_text(self):
        if self.lo is None:
            return "one round: no interval"
        cov = "" if self.coverage >= COVERAGE else f", {100 * self.coverage:.0f}% coverage"
        return f"{self.lo:.2f}-{self.hi:.2f}{cov}"

    def text(self):
        """'1.012x, same within noise (0.97-1.04)', '1.083x (1.05-1.11)' or '1.034x (one round: no interval)'."""
        same = self.same_within_noise()
        return f"{self.median:.3f}x" + (", same within noise" if same else "") + f" ({self.interval_text()})"

    def verdict(self, cand, ref, unit="faster"):
        """One sentence: 'fused: same as spmd within noise (0.97-1.04)' or 'fused: 1.08x spmd's speed ...'."""
        same = self.same_within_noise()
        if same is None:
            return f"{cand}: {self.median:.3f}x {ref}'s, one round: no interval (use more rounds)"
        if same:
            return f"{cand}: same as {ref} within noise ({self.interval_text()}, median {self.median:.3f}x)"
        word = unit if self.median > 1 else {"faster": "slower"}.get(unit, "lower")
        return f"{cand}: {word} than {ref}, {self.median:.3f}x ({self.interval_text()})"

    def as_dict(self):
        return {"median": self.median, "lo": self.lo, "hi": self.hi, "coverage": self.coverage,
                "rounds": self.rounds, "per_round": self.per_round, "same_within_noise": self.same_within_noise()}


def paired_ratio(ref, cand, higher_is_better=True):
    """Ratio of cand over ref, paired by round: ref[i] and cand[i] ran in the same round.

    higher_is_better: the values are rates (tokens/s), the ratio cand/ref; otherwise they are
    times (step ms) and the ratio is ref/cand, so > 1 always means cand is faster.
    """
    if len(ref) != len(cand):
        raise ValueError(f"paired ratio needs as many rounds on both sides ({len(ref)} vs {len(cand)})")
    if higher_is_better:
        return Ratio([c / r for r, c in zip(ref, cand)])
    return Ratio([r / c for r, c in zip(ref, cand)])


# ---- Attribution from the traces ----------------------------------------------------------------

# What a trace span counts as, by the first word of its name and that word's prefix (the trainers'
# span names: spmd_train's forward/block_bwd/optimizer/wait, pathways_train's kernels with their
# _tp/_ep/_acc variants, the pipeline's head_acc and pipe_update). Spans that enclose others
# (spmd's backward, fused's fused_step) are not counted; eval, probes and start-up spans neither.
CATEGORIES = {
    "forward": "forward", "block_fwd": "forward", "embed_fwd": "forward", "head": "forward", "batch": "forward",
    "block_bwd": "backward", "embed_bwd": "backward",
    "dp_allreduce": "gradient reduction", "wait": "gradient reduction",
    "optimizer": "update", "update": "update", "pipe_update": "update", "pipe_sqnorm": "update",
}


def category(name):
    """The category of a span name, None when it counts as none (the longest known prefix of its
    first word that ends at an underscore or the word's end)."""
    word = name.split()[0] if name else ""
    while word:
        if word in CATEGORIES:
            return CATEGORIES[word]
        if "_" not in word:
            return None
        word = word.rsplit("_", 1)[0]
    return None


STEP_END = ("optimizer", "fused_step", "update", "pipe_update")


def step_breakdown(trace_path):
    """{category: ms per step per device} from a trace, plus 'step' (the mean step) and 'rest'
    (step minus the categories: dispatch gaps, waits inside kernels not named, polling).

    Devices are the processes with step-ending spans; the controller of a Pathways run is not a
    device (its time is the devices' 'rest'). Steps: the windows between the first device's
    step-ending spans, steady ones only; 'steps' says how many were averaged.
    """
    with open(trace_path) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    devices = sorted({e["pid"] for e in ev if e["name"] in STEP_END})
    if not devices:
        return None
    ends = sorted(e["ts"] + e["dur"] for e in ev if e["name"] in STEP_END and e["pid"] == devices[0])
    if len(ends) < 2:
        return None
    # Per step (the window between two step ends; the first step, start-up, is left out).
    windows = []
    for t0, t1 in zip(ends, ends[1:]):
        w = {"step": (t1 - t0) / 1e3}
        for e in ev:
            cat = category(e["name"])
            if cat is None or e["pid"] not in devices or e.get("tid", 0) != 0:
                continue
            a, b = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
            if b > a:
                w[cat] = w.get(cat, 0.0) + (b - a) / 1e3 / len(devices)
        windows.append(w)
    # Steps with an evaluation or a checkpoint in them are not steady state: the mean is over the
    # steps no longer than 1.25x the median step.
    cut = 1.25 * median([w["step"] for w in windows])
    keep = [w for w in windows if w["step"] <= cut]
    out = {}
    for w in keep:
        for k, v in w.items():
            out[k] = out.get(k, 0.0) + v / len(keep)
    out["rest"] = out["step"] - sum(v for k, v in out.items() if k != "step")
    out["steps"] = len(keep)
    return out


def attribution(cand, ref, cand_bd, ref_bd):
    """One line: where cand's step differs from ref's, largest difference first (ms per step and
    device, from their traces)."""
    if not cand_bd or not ref_bd:
        return f"{cand}: no trace to attribute the difference"
    keys = [k for k in ("forward", "backward", "gradient reduction", "update", "rest") if k in cand_bd or k in ref_bd]
    diffs = sorted(((cand_bd.get(k, 0.0) - ref_bd.get(k, 0.0), k) for k in keys), key=lambda d: -abs(d[0]))
    parts = [f"{k} {cand_bd.get(k, 0.0):.0f} vs {ref_bd.get(k, 0.0):.0f} ({d:+.0f})" for d, k in diffs if k != "steps"]
    return (f"{cand} vs {ref}, ms per step and device: step {cand_bd['step']:.0f} vs {ref_bd['step']:.0f}; "
            + ", ".join(parts))


def main(argv):
    if len(argv) >= 2 and argv[0] == "order":
        print(" ".join(order(argv[2:], int(argv[1]))))
        return 0
    if len(argv) == 4 and argv[0] == "ratio":
        ref = [float(x) for x in argv[2].split(",") if x]
        cand = [float(x) for x in argv[3].split(",") if x]
        print(f"{argv[1]}: {paired_ratio(ref, cand).text()}")
        return 0
    print("usage: measure.py order ROUND NAME... | measure.py ratio LABEL REF,... CAND,...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
