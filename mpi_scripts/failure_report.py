#!/usr/bin/env python3
"""failure_bench.sh's report: goodput and the recoveries, from the runs' timestamped logs.

    failure_report.py OUT.json MTBF STEPS CKPT_EVERY (MODEL FREE_BASE FAULTY_BASE)...

Each BASE.log is one supervised run's output, every line prefixed with the time it was read
(seconds since the epoch), BASE.inject.log its injector's (faulty runs); BASE.jsonl is its final
attempt's metrics (the weights' hash). The
lines this reads: the trainers' "] step N/M |" lines, "] resumed from F at step S", the
supervisor's "supervise.sh: attempt K ended with exit X ...", the injector's
"failure_bench: inject: SIGKILL pid P ..." (or SIGSTOP: a stopped rank) and the script's "failure_bench: exit X"; with
pathways_train --spare-workers also the controller's "pathways liveness: the controller lost
device ..." (the loss seen in the job) and the trainer's "] recovered at step S: ... K step(s)
replayed ...; step(s) A..B run again" (the state restored, the job goes on).
"""
import json
import re
import sys

STEP = re.compile(r"\] step\s+(\d+)/\d+ \|")
RESUMED = re.compile(r"\] resumed from .* at step (\d+)")
ENDED = re.compile(r"^supervise\.sh: attempt (\d+) ended with exit (\d+)")
KILL = re.compile(r"^failure_bench: inject: SIG(?:KILL|STOP) pid (\d+)")
STOP = re.compile(r"^failure_bench: inject: SIGSTOP pid")
LOST = re.compile(r"^pathways liveness: the controller lost device (\d+)")
SPARE = re.compile(r"; it held no slice;")  # (a lost spare: nothing to recover)
RECOVERED = re.compile(r"\] recovered at step \d+: .* (\d+) step\(s\) replayed .*; step\(s\) (\d+)\.\.(\d+) run again")


def parse(lines):
    """The events of one log, in order: (time, kind, value), kind in step, resumed, ended, kill."""
    events = []
    for line in lines:
        t, _, text = line.rstrip("\n").partition(" ")
        try:
            t = float(t)
        except ValueError:
            continue
        if m := RECOVERED.search(text):  # the steps computed again: replayed, and those in flight
            events.append((t, "recovered", int(m.group(1)) + int(m.group(3)) - int(m.group(2)) + 1))
            continue
        for kind, rx in (("step", STEP), ("resumed", RESUMED), ("ended", ENDED), ("kill", KILL), ("lost", LOST)):
            m = rx.search(text)
            if m:
                events.append((t, "lost_spare" if kind == "lost" and SPARE.search(text) else kind, int(m.group(1))))
                break
    return events


def recoveries(events):
    """Per kill that ended an attempt ("how": restart): detect_s (the kill to the supervisor's
    line), restart_s (that line to the next attempt's first step), replayed (steps done before
    the kill and done again: the last step logged before it, minus the step the restart resumed
    at, plus one). Per kill the job survived ("how": in-job, pathways_train --spare-workers):
    detect_s (the kill to the controller's line that it lost the device), restore_s (that line to
    the trainer's line that it recovered: the remap, the state restored, the replay), back_s
    (that line to the next step logged) and replayed (the steps computed again: from the
    restored state to the oldest step in flight, and those in flight). A lost spare ("how":
    spare) costs nothing but its detection."""
    out = []
    last_step = None  # the last step logged so far
    pending = None    # the kill not yet resolved
    for i, (t, kind, v) in enumerate(events):
        if kind == "step":
            if pending and "ended_t" in pending and "restart_s" not in pending:
                pending["restart_s"] = t - pending["ended_t"]
                out.append(pending)
                pending = None
            elif pending and "recovered_t" in pending:
                pending["back_s"] = t - pending["recovered_t"]
                out.append(pending)
                pending = None
            last_step = v
        elif kind in ("lost", "lost_spare") and pending is not None and "lost_t" not in pending and "ended_t" not in pending:
            pending.update(lost_t=t, detect_s=t - pending["kill_t"], how="in-job" if kind == "lost" else "spare")
            if kind == "lost_spare":
                out.append(pending)
                pending = None
        elif kind == "recovered" and pending is not None and "lost_t" in pending:
            pending.update(recovered_t=t, restore_s=t - pending["lost_t"], replayed=v)
        elif kind == "kill" and pending is not None and "ended_t" in pending and "restart_s" not in pending:
            out.append(pending)  # killed again during the restart: that restart has no restart_s
            pending = {"kill_t": t, "last_step": last_step}
        elif kind == "kill" and pending is None:
            pending = {"kill_t": t, "last_step": last_step}
        elif kind == "ended" and pending is not None and "ended_t" not in pending:
            # (also when the job saw the loss but could not go on: detect is then the kill to this line)
            pending.update(ended_t=t, detect_s=t - pending["kill_t"], how="restart")
        elif kind == "resumed" and pending is not None and "ended_t" in pending:
            done = pending["last_step"]
            pending["resumed_at"] = v
            pending["replayed"] = 0 if done is None else max(0, done - v + 1)
    keys = ("how", "detect_s", "restart_s", "restore_s", "back_s", "replayed")
    return [{k: r[k] for k in keys if k in r} for r in out]


def read_logs(base):
    """BASE.log and, when there is one, its injector's BASE.inject.log, merged in time order."""
    lines = open(base + ".log").read().splitlines()
    try:
        lines += open(base + ".inject.log").read().splitlines()
    except FileNotFoundError:
        pass

    def t(line):
        try:
            return float(line.split(" ", 1)[0])
        except ValueError:
            return float("inf")
    return sorted(lines, key=t)


def run_summary(base):
    lines = read_logs(base)
    ev = parse(lines)
    times = [float(l.split(" ", 1)[0]) for l in lines if l.split(" ", 1)[0].replace(".", "", 1).isdigit()]
    final = None
    for line in open(base + ".jsonl"):
        j = json.loads(line)
        if j.get("final"):
            final = j
    return {
        "wall_s": (max(times) - min(times)) if times else 0.0,
        "faults": sum(1 for e in ev if e[1] == "kill"),
        "stops": sum(1 for l in lines if STOP.search(l.split(" ", 1)[-1])),  # (of the faults)
        "restarts": sum(1 for e in ev if e[1] == "ended"),
        "in_job": sum(1 for e in ev if e[1] == "recovered"),
        "recoveries": recoveries(ev),
        "weights_hash": final["weights_hash"] if final else None,
    }


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def report(models, mtbf, steps, ckpt_every):
    """models: [(name, free_summary, faulty_summary)] -> (json dict, text lines)."""
    rows, text = [], []
    text.append(f"failure_bench: MTBF {mtbf:g} s, {steps} steps, a checkpoint every {ckpt_every} steps")
    text.append(f"{'trainer':>14} {'free s':>8} {'faulty s':>9} {'goodput':>8} {'faults':>7} {'restarts':>9} {'in-job':>7} "
                f"{'detect s':>9} {'restart s':>10} {'restore s':>10} {'replayed':>9} {'same weights':>13}")
    for name, free, faulty in models:
        goodput = free["wall_s"] / faulty["wall_s"] if faulty["wall_s"] > 0 else None
        rec = faulty["recoveries"]
        med = {k: median([r[k] for r in rec if k in r]) for k in ("detect_s", "restart_s", "restore_s")}
        med["replayed"] = median([r["replayed"] for r in rec if r.get("how") == "restart" and "replayed" in r])
        same = free["weights_hash"] is not None and free["weights_hash"] == faulty["weights_hash"]
        rows.append({"trainer": name, "free": free, "faulty": faulty, "goodput": goodput,
                     "median_recovery": med, "same_weights": same})
        f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
        text.append(f"{name:>14} {free['wall_s']:8.1f} {faulty['wall_s']:9.1f} {f(goodput, 3):>8} {faulty['faults']:7d} "
                    f"{faulty['restarts']:9d} {faulty.get('in_job', 0):7d} {f(med['detect_s']):>9} {f(med['restart_s']):>10} "
                    f"{f(med['restore_s'], 2):>10} {f(med['replayed'], 0):>9} {'yes' if same else 'NO':>13}")
        if faulty.get("stops"):
            text.append(f"{'':>14} {faulty['stops']} of the {faulty['faults']} faults were SIGSTOP (a stopped rank), "
                        "the others SIGKILL")
        full = [r for r in rec if all(k in r for k in ("detect_s", "restart_s", "replayed"))]
        if full:  # (a kill before the first checkpoint restarts from step 0: no resume line)
            r = full[0]
            text.append(f"{'':>14} one restart ({name}, the first from a checkpoint): detected {f(r.get('detect_s'))} s after the kill, "
                        f"the next attempt's first step {f(r.get('restart_s'))} s later, "
                        f"{r.get('replayed', '-')} steps replayed")
        inj = [r for r in rec if r.get("how") == "in-job" and "back_s" in r]
        if inj:
            r = inj[0]
            text.append(f"{'':>14} one recovery in the job ({name}, the first): detected {f(r['detect_s'])} s after the kill, "
                        f"the state restored and the steps since replayed {f(r['restore_s'], 2)} s later, the next "
                        f"step {f(r['back_s'], 2)} s after that, {r['replayed']} steps computed again")
    text.append("goodput: the fault-free run's wall time over the faulty run's (the same steps); detect, restart, "
                "restore and replayed: medians over the recoveries (restart, replayed: the job restarted by the "
                "supervisor; restore: recovered in the job; detect: both)")
    return {"mtbf_s": mtbf, "steps": steps, "ckpt_every": ckpt_every, "rows": rows}, text


def main(argv):
    out, mtbf, steps, ckpt_every = argv[1], float(argv[2]), int(argv[3]), int(argv[4])
    rest = argv[5:]
    if len(rest) % 3 != 0 or not rest:
        sys.exit("failure_report.py: error: give MODEL FREE_BASE FAULTY_BASE triples")
    models = [(rest[i], run_summary(rest[i + 1]), run_summary(rest[i + 2])) for i in range(0, len(rest), 3)]
    doc, text = report(models, mtbf, steps, ckpt_every)
    print("\n".join(text))
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    bad = [r["trainer"] for r in doc["rows"] if not r["same_weights"]]
    if bad:
        sys.exit(f"failure_report.py: error: the faulty run's weights differ from the fault-free run's: {', '.join(bad)}")


if __name__ == "__main__":
    main(sys.argv)
