#!/usr/bin/env python3
"""Projects goodput against the job's MTBF and the checkpoint interval (docs/failures.md, "Goodput
at scale"): checkpoint-restart, what both trainers do today, against in-job recovery onto a spare
device from a replica's memory, what a single controller could do (not built here).

    sim/project_goodput.py [--bench FAILURE_JSON] [--validation FILE] [--out FILE]

The model (Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart
dumps"): failures arrive at exponential gaps of mean M. A segment of `tau` seconds of training
followed by a checkpoint of `delta` seconds, restarted after `R` seconds whenever a failure cuts
it (failures interrupt restarts too), takes M e^(R/M) (e^((tau + delta)/M) - 1) seconds of wall
time on average. Goodput is the
training time over the wall time. In-job recovery is the same formula with one step as the
segment and no checkpoint: a failure costs the recovery and the step it interrupted. The
controller's own loss is a checkpoint-restart at the MTBF of one host.

With --bench, the first check is this machine: the measured detection and restart times of
mpi_scripts/failure_bench.sh's JSON predict the goodput it measured. Then the projection to
Llama 3's scale, every number listed as sourced or assumed, written to --out with the results.
Each projected goodput comes with a band: the range the model's signed errors against measured
goodput put around it (mpi_scripts/sim_band.py): those of --bench's check, or of the goodput_*
rows of --validation (sim_validate.sh's validation.json); with neither, no band, said so.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mpi_scripts"))
import sim_band  # noqa: E402  (the scripts' folder, added above)


def wall_per_segment(tau, delta, restart, mtbf):
    """Expected wall seconds to complete tau seconds of training plus a delta-second checkpoint,
    failures at exponential gaps of mean mtbf at any time, each costing `restart` seconds before
    the segment starts again; a failure during a restart begins it again (Daly's exponential
    model)."""
    if mtbf == math.inf:
        return tau + delta
    return mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf)


def lost_per_fault(tau, restart, mtbf):
    """Expected wall seconds one fault costs under checkpoint-restart with no checkpoint cost: the
    restart, and the training done since the last checkpoint, which the fault (exponential
    arrivals, mean mtbf) cuts within a segment of tau: E[x | x < tau] = M - tau / (e^(tau/M) - 1),
    tau / 2 when tau << M."""
    if mtbf == math.inf or tau <= 0:
        return restart
    return restart + mtbf - tau / math.expm1(tau / mtbf)


def goodput_at_faults(train_s, faults, tau, restart, mtbf):
    """Goodput of a run of train_s seconds of fault-free training that `faults` faults cut, each
    costing lost_per_fault: the model given the fault count one run drew, not its expectation."""
    return train_s / (train_s + faults * lost_per_fault(tau, restart, mtbf))


def goodput_checkpoint(tau, delta, restart, mtbf):
    """Checkpoint-restart: training time over wall time, checkpoints every tau seconds."""
    return tau / wall_per_segment(tau, delta, restart, mtbf)


def best_interval(delta, restart, mtbf):
    """The checkpoint interval with the highest goodput (golden-section search over
    [delta / 100, 10 mtbf]; Young's sqrt(2 delta M) is its first-order estimate)."""
    lo, hi = max(delta / 100.0, 1e-3), 10.0 * mtbf
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(200):
        if goodput_checkpoint(a, delta, restart, mtbf) > goodput_checkpoint(b, delta, restart, mtbf):
            hi, b = b, a
            a = hi - g * (hi - lo)
        else:
            lo, a = a, b
            b = lo + g * (hi - lo)
    return (lo + hi) / 2


def goodput_in_job(step, recover, mtbf, controller_mtbf, ckpt_delta, ckpt_restart):
    """In-job recovery: a worker's loss costs `recover` seconds and the interrupted step (one step
    is the segment, no checkpoint); the controller's loss (mean gap controller_mtbf) is a
    checkpoint-restart at the interval best for it."""
    worker = step / wall_per_segment(step, 0.0, recover, mtbf)
    tau = best_interval(ckpt_delta, ckpt_restart, controller_mtbf)
    return worker * goodput_checkpoint(tau, ckpt_delta, ckpt_restart, controller_mtbf)


def check_bench(path):
    """The model against failure_bench.sh's measurement: the same MTBF, checkpoint interval and
    the measured medians of detection and restart (and the checkpoint's write time, ~0 at this
    size) predict each trainer's goodput. 'predicted' is the model at the fault count the run drew
    (goodput_at_faults): one run of 2-4 faults is one draw of a Poisson count (sd ~ its square
    root), which no expectation can predict, while what each fault costs is the model's to get
    right; 'predicted_expected' is Daly's expectation over the draws (what the projection uses,
    where a job sees thousands of faults). A JSON without the faulty run's count: the expectation."""
    with open(path) as f:
        doc = json.load(f)
    out = []
    for row in doc["rows"]:
        free = row["free"]
        step = free["wall_s"] / doc["steps"]
        tau = doc["ckpt_every"] * step
        med = row["median_recovery"]
        restart = (med.get("detect_s") or 0.0) + (med.get("restart_s") or 0.0)
        expected = goodput_checkpoint(tau, 0.0, restart, doc["mtbf_s"])
        faults = (row.get("faulty") or {}).get("faults")
        pred = expected if faults is None else goodput_at_faults(free["wall_s"], faults, tau, restart, doc["mtbf_s"])
        out.append({"trainer": row["trainer"], "measured": row["goodput"], "predicted": pred, "predicted_expected": expected,
                    "faults": faults, "step_s": step, "restart_s": restart, "tau_s": tau})
    return out


# Llama 3's pre-training, as its paper reports it; everything else is an assumption.
SOURCED = [
    "Llama 3 (Dubey et al. 2024, section 3.3.4): 419 unexpected interruptions in 54 days of pre-training on "
    "16,384 H100 GPUs: a job MTBF of 54 x 24 / 419 = 3.09 h",
    "Gemini (Gemini team 2023): goodput raised from 85% to 97% by in-memory redundant state and fast "
    "reconfiguration instead of checkpoint-restart",
]
ASSUMPTIONS = {
    "step_s": (10.0, "a training step of 10 s (a 405B model at 16k GPUs, ~16M tokens a step)"),
    "ckpt_write_s": (60.0, "writing a checkpoint stalls training 60 s (a 405B model's state to a parallel file system)"),
    "restart_s": (600.0, "a checkpoint-restart takes 10 min: detection, reallocating the job, relaunching 16k "
                         "processes, loading the checkpoint"),
    "in_job_recover_s": (20.0, "in-job recovery takes 20 s: liveness detects the loss (a few s), the resource "
                               "manager remaps the slice onto a spare, the state (16 B a parameter of the slice) "
                               "comes from another replica over the DCN"),
    "hosts": (2048, "2048 hosts of 8 GPUs; the controller is one more host, as likely to fail as any"),
}


def goodput_range(value, band):
    """(low, high) a projected goodput takes over the band of the model's errors (a goodput is a
    figure like a time: measured = predicted / (1 + e)), at most 1."""
    lo, hi = sim_band.time_range(value, band)
    return min(lo, 1.0), min(hi, 1.0)


def check_band(checks):
    """The band of the check's rows (predicted against measured goodput), None without rows."""
    rows = [{"predicted": c["predicted"], "measured": c["measured"]} for c in checks if c["measured"] > 0]
    return sim_band.error_band(rows) if rows else None


def project(mtbf_h_list, step, delta, restart, recover, hosts):
    rows = []
    for h in mtbf_h_list:
        mtbf = h * 3600.0
        tau = best_interval(delta, restart, mtbf)
        ckpt = goodput_checkpoint(tau, delta, restart, mtbf)
        injob = goodput_in_job(step, recover, mtbf, mtbf * hosts, delta, restart)
        rows.append({"mtbf_h": h, "best_ckpt_interval_min": tau / 60.0, "young_interval_min":
                     math.sqrt(2 * delta * mtbf) / 60.0, "goodput_checkpoint_restart": ckpt,
                     "goodput_in_job_recovery": injob})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", help="failure_bench.sh's JSON (DIR/failure_bench.json): check the model first")
    ap.add_argument("--validation", help="sim_validate.sh's validation.json: the band of its goodput_* rows")
    ap.add_argument("--out", help="write the projection and its assumptions here (JSON)")
    a = ap.parse_args(argv)
    doc = {"sourced": SOURCED, "assumptions": {k: v[1] for k, v in ASSUMPTIONS.items()}}
    band = None
    if a.validation:
        try:
            band = sim_band.load_band(a.validation, ["goodput_"])
        except (OSError, ValueError, KeyError) as e:
            print(f"project_goodput.py: error: {e}", file=sys.stderr)
            return 1
    if a.bench:
        doc["check"] = check_bench(a.bench)
        print("The model against this machine's measurement (failure_bench.sh):")
        for c in doc["check"]:
            print(f"  {c['trainer']:<24} measured goodput {c['measured']:.3f}, predicted {c['predicted']:.3f} at its "
                  f"{c['faults']} faults, {c['predicted_expected']:.3f} expected (step {c['step_s']:.2f} s, a checkpoint every "
                  f"{c['tau_s']:.1f} s, detect + restart {c['restart_s']:.1f} s)")
        band = band or check_band(doc["check"])
    v = {k: val for k, (val, _) in ASSUMPTIONS.items()}
    doc["projection"] = project([0.5, 1.0, 3.09, 10.0], v["step_s"], v["ckpt_write_s"], v["restart_s"],
                                v["in_job_recover_s"], v["hosts"])
    print("Projection (sourced: " + "; ".join(SOURCED) + ")")
    print("Assumptions: " + "; ".join(d for d in doc["assumptions"].values()))
    doc["band"] = band
    print(f"Band: {sim_band.band_note(band)}" if band else "Band: none (give --bench or --validation: the model's errors "
          "against a measured goodput)")
    print(f"{'job MTBF h':>10} {'best ckpt interval min':>23} {'(Young)':>8} {'checkpoint-restart':>26} {'in-job recovery':>24}")
    for r in doc["projection"]:
        cells = []
        for k in ("goodput_checkpoint_restart", "goodput_in_job_recovery"):
            if band:
                r[k + "_band"] = goodput_range(r[k], band)
                cells.append(f"{r[k]:.3f} ({sim_band.band_text(*r[k + '_band'], '{:.3f}')})")
            else:
                cells.append(f"{r[k]:.3f}")
        print(f"{r['mtbf_h']:>10.2f} {r['best_ckpt_interval_min']:>23.1f} {r['young_interval_min']:>8.1f} "
              f"{cells[0]:>26} {cells[1]:>24}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
