#!/usr/bin/env python3
"""Whether a training run's loss curve trains: falls below ln V, keeps falling, and has no spike.

    loss_curve.py METRICS.jsonl [--vocab 256] [--window 10] [--lookback 5] [--margin 0.05]

Reads a trainer's --metrics file (its step lines) and judges the training loss by three rules,
each printed with the figures behind it:
  - below ln V: the loss falls below ln(vocab), the loss of a uniform guess (5.545 at 256), and
    the last step is below it;
  - keeps falling: the mean over each window of `window` steps is below the previous window's
    (50 steps: five windows of 10);
  - no spike: no step's loss is more than `margin` (5%) above the highest of the `lookback` (5)
    steps before it. One batch's loss differs from the next by up to 0.1-0.3 here (8 sequences a
    step), and on the plateau after ~25 steps a batch a little harder than the five before it is
    common (+0.7% to +1.5% in the presets' curves), so neither a rise from the previous step nor
    a step just above its five predecessors is a spike; a jump well above all of them is the start
    of a divergence (the 100m preset at lr 3e-4: 2.90 -> 3.64 at step 11, +13.6% above the 3.21
    of the five before it; the issue's run at the default rate: 5.25 -> 8.88).
Exits 0 when all three hold, 1 when one does not, 2 on bad input. Used for docs/results/presets.md
(issue 57: "the preset's loss curve falls without a spike over its first 50 steps").
"""
import argparse
import json
import math
import sys


def losses(path):
    out = []
    try:
        for line in open(path):
            j = json.loads(line)
            if "loss" in j and "step" in j and not j.get("final"):
                out.append((j["step"] + 1, j["loss"]))
    except (OSError, ValueError) as e:
        raise SystemExit(f"loss_curve: error: cannot read {path}: {e}")
    return [l for _, l in sorted(out)]


def judge(curve, vocab=256, window=10, lookback=5, margin=0.05):
    """{rule: (holds, text)} for a list of per-step losses (step 1 first)."""
    if len(curve) < 2 * window:
        raise ValueError(f"the curve has {len(curve)} steps: at least {2 * window} (two windows) are needed")
    floor = math.log(vocab)
    below = next((i + 1 for i, l in enumerate(curve) if l < floor), None)
    r = {"below_uniform": (below is not None and curve[-1] < floor,
                           f"below ln {vocab} = {floor:.3f} from step {below}, last step {curve[-1]:.3f}"
                           if below else f"never below ln {vocab} = {floor:.3f}")}
    means = [sum(curve[i:i + window]) / window for i in range(0, len(curve) - window + 1, window)]
    rises = [i for i in range(1, len(means)) if means[i] >= means[i - 1]]
    r["keeps_falling"] = (not rises, f"means of {window}-step windows " + " ".join(f"{m:.3f}" for m in means)
                          + ("" if not rises else f"; window {rises[0] + 1} does not fall"))
    spikes = [(i + 1, curve[i], max(curve[i - lookback:i])) for i in range(lookback, len(curve))
              if curve[i] > (1 + margin) * max(curve[i - lookback:i])]
    worst = max(((curve[i] - curve[i - 1], i + 1) for i in range(1, len(curve))), default=(0, 0))
    r["no_spike"] = (not spikes, (f"no step more than {100 * margin:.0f}% above the highest of the {lookback} before it" if not spikes else
                                  "step " + ", ".join(f"{s}: {l:.3f}, {100 * (l / m - 1):+.1f}% above {m:.3f}" for s, l, m in spikes))
                     + f"; largest rise from one step to the next {worst[0]:+.3f} (step {worst[1]})")
    return r


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--lookback", type=int, default=5)
    ap.add_argument("--margin", type=float, default=0.05)
    a = ap.parse_args(argv)
    curve = losses(a.metrics)
    try:
        r = judge(curve, a.vocab, a.window, a.lookback, a.margin)
    except ValueError as e:
        print(f"loss_curve: error: {a.metrics}: {e}", file=sys.stderr)
        return 2
    for name, (ok, text) in r.items():
        print(f"{name}: {'yes' if ok else 'NO'} ({text})")
    ok = all(v[0] for v in r.values())
    print(f"{a.metrics}: {len(curve)} steps, " + ("trains: falls below the uniform loss, keeps falling, no spike"
                                                 if ok else "does not train cleanly"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
