#!/usr/bin/env python3
"""End-to-end tests of pathways_train against spmd_train under real mpirun.

    pathways_cases.py CASE BUILD_DIR

The reference is always spmd_train on the same workload (tiny model, default corpus): with the
same dp/tp sharding the Pathways runs (fused, chained, opbyop) must give the same bits; the MPMD
pipeline adds the embedding's two gradient parts in another order, so it agrees to a tolerance.

The cases of replicas (replicas_cases.py) and of in-job recovery (recovery_cases.py) are in
files of their own beside this one, imported here: CTest runs them all through this file. What
every case file shares is tests/harness/.
"""
import math
import os
import signal
import subprocess
import time

from harness import launch
from harness.checks import check_mfu_never_over_one, check_nonfinite_stop, check_overlap, nan_step_runs
from harness.compare import FIELDS, RTOL, assert_bitwise, assert_close_curves
from harness.errors import expect_error, one_error_line
from harness.launch import MPIRUN, NP_FLAG, case_main, mpmd, run, small_tmpfs, trainer
from harness.outputs import metrics, temp_leftovers
from harness.workloads import TINY, train
from recovery_cases import (case_spare_worker_recovers_a_pipeline, case_spare_worker_recovers_bitwise,  # noqa: F401
                            case_spare_worker_survives_a_stop)
from replicas_cases import (case_fsdp_equals_spmd, case_replicas_bad_inputs_fail_cleanly,  # noqa: F401
                            case_replicas_dp2_match_spmd_dp4, case_replicas_equal_spmd_dp,
                            case_replicas_exchange_overlaps_backward, case_replicas_hold_one_step_of_pieces,
                            case_replicas_resume_across_meshes)


def case_bitwise_equal_to_spmd():
    # dp 3: from three summands the order of the gradient sum shows in the bits; chained sums its
    # per-layer pieces as spmd_train's buckets (docs/pathways_train.md, "The dp sums").
    for mesh, np_ in ((["--dp", "2"], 2), (["--tp", "2"], 2), (["--dp", "2", "--microbatches", "2"], 2),
                      (["--dp", "3", "--batch", "12"], 3)):
        ref = train(np_, "spmd" + "".join(mesh), mesh)
        for g in ("fused", "chained", "opbyop"):
            if g == "opbyop" and ("--microbatches" in mesh or np_ == 3):  # (opbyop at dp 3: the in-process suite)
                continue
            got = train(np_ + 1, g + "".join(mesh), mesh + ["--granularity", g], exe="pathways")
            assert_bitwise(ref, got, f"pathways {g} {' '.join(mesh)}")
    # Sequential dispatch (the paper's baseline) computes the same thing.
    ref = train(2, "spmd_seq", ["--dp", "2"])
    assert_bitwise(ref, train(3, "chained_seq", ["--dp", "2", "--granularity", "chained", "--sequential"],
                              exe="pathways"), "pathways chained --sequential")


def case_bitwise_equal_to_spmd_bf16():
    # --precision bf16: the same bits as spmd_train on the same sharding (oneDNN's matmul is
    # deterministic for a fixed shape and ISA, and both trainers run the same shapes), and the
    # same bits from a second spmd_train run. The fp32 run must differ: the flag reached the
    # ranks that multiply.
    bf16 = ["--precision", "bf16"]
    fp32 = train(2, "spmd_dp2_fp32", ["--dp", "2"])
    for mesh in (["--dp", "2"], ["--tp", "2"]):
        ref = train(2, "spmd_bf16" + "".join(mesh), mesh + bf16)
        if mesh == ["--dp", "2"]:
            assert_bitwise(ref, train(2, "spmd_bf16_again", mesh + bf16), "spmd_train bf16, second run")
            s0 = min(ref[0])
            assert ref[0][s0]["loss"] != fp32[0][s0]["loss"], "bf16 gave the fp32 bits: the flag did not reach the GEMMs"
        for g in ("fused", "chained"):
            got = train(3, g + "_bf16" + "".join(mesh), mesh + bf16 + ["--granularity", g], exe="pathways")
            assert_bitwise(ref, got, f"pathways {g} {' '.join(mesh)} --precision bf16")
    # A bad value: one line, every rank exits non-zero, no output left.
    m = os.path.join(launch.TMP, "bad_precision.jsonl")
    for exe, n in (("spmd", 2), ("pathways", 3)):
        expect_error(n, TINY + ["--precision", "fp16", "--metrics", m], "--precision 'fp16': expected one of fp32, bf16",
                     [m], exe=exe)


def case_pipeline_matches_spmd():
    # Tolerance: the pipeline sums the tied embedding's gradient as (head parts) + (lookup parts)
    # instead of interleaved per micro-batch; the difference is float rounding (~1e-7 relative)
    # carried through AdamW, as for dp/tp in tests/spmd (same 1e-5 bound, same reasoning).
    ref = train(1, "spmd_m4", ["--microbatches", "4"])
    for sched in ("gpipe", "1f1b"):
        got = train(3, "pipe2_" + sched, ["--stages", "2", "--microbatches", "4", "--schedule", sched], exe="pathways")
        assert_close_curves(ref, got, RTOL, f"pipeline S=2 M=4 {sched} vs spmd")
        assert 0.0 <= got[2]["bubble"] < 1.0 and abs(got[2]["bubble_bound"] - 1 / 5) < 1e-12
    # Four stages over four layers.
    four = ["--layers", "4", "--microbatches", "4"]
    ref4 = train(1, "spmd_l4", four)
    got4 = train(5, "pipe4", four + ["--stages", "4", "--schedule", "1f1b"], exe="pathways")
    assert_close_curves(ref4, got4, RTOL, "pipeline S=4 M=4 1f1b vs spmd")


def case_pipeline_stages_of_dp_tp_match_spmd():
    # Each stage a slice of 2 devices: data parallel (its gradient pieces summed over the stage's
    # dp group by dp_allreduce nodes inside the slice) or tensor parallel (the blocks' tp
    # collectives inside the slice; the stage's norm share summed over its tp group), activations
    # and their gradients moving between corresponding devices of the two stages. Against
    # spmd_train with the same sharding on the same global batch, with the tolerance
    # pipeline_matches_spmd derives (the tied embedding's two parts are summed in another order).
    for mesh in (["--dp", "2"], ["--tp", "2"]):
        m4 = mesh + ["--microbatches", "4"]
        ref = train(2, "spmd" + "".join(m4), m4)
        got = train(5, "pipe2x2" + "".join(m4), m4 + ["--stages", "2", "--schedule", "1f1b"], exe="pathways")
        assert_close_curves(ref, got, RTOL, f"pipeline S=2 of {' '.join(mesh)} 1f1b vs spmd {' '.join(mesh)}")
        for s in ref[0]:
            a, b = ref[0][s]["grad_norm"], got[0][s]["grad_norm"]
            assert abs(a - b) <= RTOL * abs(a), f"step {s} gradient norm {b} vs spmd {a}"


def backward_during_reductions(trace_path, kernels=("dp_reduce_start", "dp_reduce_finish", "dp_allreduce")):
    """From a --trace file, per worker row: (its gradient reductions, how many of its block_bwd
    kernels started inside one, how many sums the device saw complete only after such a
    block_bwd had started). A reduction's window: from its start kernel (dp_reduce_start) to its
    finish kernel (dp_reduce_finish; paired in order: every device finishes them in the order it
    started them), or a blocking kernel's own span (dp_allreduce). Order of events on one
    worker's clock."""
    start, finish, blocking = kernels
    import json
    ev = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    rows = {}
    for pid in {e["pid"] for e in ev if e["name"].startswith("block_bwd")}:
        mine = sorted((e for e in ev if e["pid"] == pid), key=lambda e: e["ts"])
        starts = [e["ts"] for e in mine if e["name"] == start]
        ends = [e["ts"] for e in mine if e["name"] == finish]
        assert len(starts) == len(ends), f"row {pid}: {len(starts)} {start}, {len(ends)} {finish}"
        win = list(zip(starts, ends)) + [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["name"] == blocking]
        seen = [e["ts"] + e["dur"] for e in mine if e.get("cat") == "reduce"]  # the sums' completions
        bwd = [e["ts"] for e in mine if e["name"].startswith("block_bwd")]
        during = [t for t in bwd if any(a < t < b for a, b in win)]
        late = sum(1 for a, b in zip(starts, seen) if any(a < t < b for t in during))
        rows[pid] = (len(win), len(during), late)
    return rows


def case_pipeline_stage_dp_reduce_overlaps_backward():
    # Issue 16: a stage's gradient AllReduce (inside its dp slice) overlaps the rest of its
    # backward: a layer's sum starts after the layer's last backward unit and the stage's next
    # backward unit does not wait for it (dp_reduce_start ... dp_reduce_finish after the stage's
    # backward; the sum advances between kernels). Checked from each stage worker's own trace: with
    # overlap (the default) a block_bwd starts inside a reduction's window on every worker and
    # step (each stage: layer L-1's sum while layer L-2's backward runs); with --no-overlap (the
    # control, the blocking dp_allreduce node, so the check can fail) none does. Both give the
    # same bits: the same AllReduce of the same pieces, only finished at another time.
    S, dp, steps = 2, 2, 3
    # Layers of the reference width (a layer's gradient ~3.8 MB) over TINY's short sequences.
    flags = ["--stages", str(S), "--dp", str(dp), "--microbatches", "4", "--layers", "4", "--steps", str(steps),
             "--d-model", "256", "--d-ff", "1024", "--head-dim", "64", "--schedule", "1f1b"]
    got = {}
    for name, extra in (("overlap", []), ("no_overlap", ["--no-overlap"])):
        t = os.path.join(launch.TMP, f"stage_reduce_{name}.json")
        got[name] = train(S * dp + 1, "stage_reduce_" + name, flags + extra + ["--trace", t], exe="pathways")
        rows = backward_during_reductions(t)
        assert len(rows) == S * dp, f"{name}: block_bwd on rows {sorted(rows)}, want {S * dp} workers"
        print(f"{name}: per worker row (reductions, block_bwd started inside one, sums seen complete after it): {rows}")
        for pid, (nred, during, _) in rows.items():
            # Each stage reduces its 2 layers once per step (stage 0 also the tied embedding's piece).
            assert nred in (2 * steps, 3 * steps), f"{name}: worker row {pid} has {nred} reductions for {steps} steps"
            want = steps if name == "overlap" else 0
            assert during == want, f"{name}: worker row {pid}: {during} block_bwd started inside a reduction, want {want}"
    assert got["overlap"][2]["weights_hash"] == got["no_overlap"][2]["weights_hash"], "overlap changed the bits"


def case_fsdp_reduce_scatter_overlaps_gather():
    # Issue 40: with --fsdp at chained, layer l's gradient is reduce-scattered while layer l-1's
    # weights are gathered (fsdp_rs_start after block_bwd(l), fsdp_gather of l-1, fsdp_rs_finish
    # before block_bwd(l-1)), as spmd_train's Fsdp runs the two. Checked on every worker's own
    # trace: with overlap each step's gathers for the backward of layers L-2..0 start inside the
    # previous layer's reduce-scatter window; with --no-overlap (the control: the blocking
    # fsdp_reduce_scatter node) none does. No block_bwd starts inside a window: the reduce-scatter
    # is complete before the next backward (the runtime progresses it only between kernels and in
    # waits; programs/trace_impl.h, FsdpNodes). The same bits either way.
    import json
    dp, L, steps = 2, 4, 3
    flags = ["--dp", str(dp), "--fsdp", "--granularity", "chained", "--layers", str(L), "--steps", str(steps),
             "--d-model", "256", "--d-ff", "1024", "--head-dim", "64"]
    got = {}
    for name, extra in (("overlap", []), ("no_overlap", ["--no-overlap"])):
        t = os.path.join(launch.TMP, f"fsdp_rs_{name}.json")
        got[name] = train(dp + 1, "fsdp_rs_" + name, flags + extra + ["--trace", t], exe="pathways")
        rows = backward_during_reductions(t, ("fsdp_rs_start", "fsdp_rs_finish", "fsdp_reduce_scatter"))
        assert len(rows) == dp, f"{name}: block_bwd on rows {sorted(rows)}, want {dp} workers"
        ev = [e for e in json.load(open(t))["traceEvents"] if e.get("ph") == "X"]
        for pid, (nrs, during, _) in rows.items():
            mine = sorted((e for e in ev if e["pid"] == pid), key=lambda e: e["ts"])
            starts = [e["ts"] for e in mine if e["name"] == "fsdp_rs_start"]
            ends = [e["ts"] for e in mine if e["name"] == "fsdp_rs_finish"]
            win = list(zip(starts, ends)) + [(e["ts"], e["ts"] + e["dur"]) for e in mine
                                             if e["name"] == "fsdp_reduce_scatter"]
            gathers = sum(1 for e in mine if e["name"] == "fsdp_gather" and any(a < e["ts"] < b for a, b in win))
            print(f"{name}: worker row {pid}: {nrs} reduce-scatters, {gathers} gathers and {during} block_bwd "
                  f"started inside one")
            assert nrs == L * steps, f"{name}: worker row {pid} has {nrs} reduce-scatters for {L} layers x {steps} steps"
            want = (L - 1) * steps if name == "overlap" else 0
            assert gathers == want, f"{name}: worker row {pid}: {gathers} gathers inside a reduce-scatter, want {want}"
            assert during == 0, f"{name}: worker row {pid}: a block_bwd started inside a reduce-scatter"
    assert got["overlap"][2]["weights_hash"] == got["no_overlap"][2]["weights_hash"], "overlap changed the bits"


def case_pipeline_replicas_match_spmd():
    # Issue 16: --stages with --replicas: two replicas, each a pipeline of 2 stages (one island
    # per replica, --islands 2x2), exchanging every stage's gradient pieces with the other
    # replica's corresponding stage (replica_add in replica order on both), against spmd_train
    # --dp 2 on the same global batch. Tolerance: the pipeline's (pipeline_matches_spmd: the tied
    # embedding's two parts are summed in another order). That both replicas end with the same
    # bits is checked by pathways_train itself (it fails the run otherwise).
    m4 = ["--microbatches", "4"]
    ref = train(2, "spmd_dp2_m4", ["--dp", "2"] + m4)
    for sched in ("1f1b", "gpipe"):
        got = train(5, "pipe_r2_" + sched, ["--replicas", "2", "--stages", "2", "--islands", "2x2", "--schedule", sched] + m4,
                    exe="pathways")
        assert_close_curves(ref, got, RTOL, f"2 replicas of a 2-stage {sched} pipeline vs spmd --dp 2")
        for s in ref[0]:
            a, b = ref[0][s]["grad_norm"], got[0][s]["grad_norm"]
            assert abs(a - b) <= RTOL * abs(a), f"step {s} gradient norm {b} vs spmd {a}"
        f = got[2]
        assert f["stage_islands"] == [0, 0, 1, 1], f"replica r's stages on island r: {f['stage_islands']}"
        # Between the replicas per step: every device sends each of its stage's pieces (the
        # stages' pieces tile the whole gradient; the tied one once, on stage 0) and the last
        # stage its loss: 2 x 1 x (the whole gradient + 8 bytes) as for replicas of one slice.
        assert f["dcn_bytes_per_step"] == 2 * (4 * f["state_bytes"] // 16 + 8), f


def stage0_forwards_before_first_backward(trace_path):
    """Per step, from stage 0's own kernel spans (its worker's execution order): how many
    micro-batch forwards (embed_fwd) started before its first backward (block_bwd)."""
    import json
    ev = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    pids = {e["pid"] for e in ev if e["name"] == "embed_fwd"}
    assert len(pids) == 1, f"embed_fwd (stage 0's) on rows {pids}"
    mine = sorted((e for e in ev if e["pid"] in pids), key=lambda e: e["ts"])
    counts, fwd, seen_bwd = [], 0, False
    for e in mine:
        if e["name"] == "embed_fwd" and not seen_bwd:
            fwd += 1
        elif e["name"] == "block_bwd" and not seen_bwd:
            counts.append(fwd)
            seen_bwd = True
        elif e["name"] == "pipe_update":  # the step's end on this stage
            fwd, seen_bwd = 0, False
    return counts, pids.pop()


def case_pipeline_1f1b_order_and_memory():
    # The schedule is checked from what stage 0's worker ran (its kernel spans in --trace), not
    # from the program's node order: 1F1B starts micro-batch 0's backward after S forwards (before
    # forward number S), GPipe after all M. The memory: stage 0's intermediates (activations and
    # gradients in flight, the most alive at once on its worker) are lower under 1F1B (it holds at
    # most S micro-batches' activations) than under GPipe (all M). Both compute the same sums in the
    # same order, so their weights are bitwise equal.
    S, M = 2, 8
    flags = ["--stages", str(S), "--microbatches", str(M), "--seq-len", "64", "--batch", "16", "--steps", "3"]
    got = {}
    for sched in ("gpipe", "1f1b"):
        t = os.path.join(launch.TMP, f"order_{sched}.json")
        got[sched] = train(S + 1, "order_" + sched, flags + ["--schedule", sched, "--trace", t], exe="pathways")
        counts, pid = stage0_forwards_before_first_backward(t)
        want = S if sched == "1f1b" else M
        assert len(counts) == 3 and all(c == want for c in counts), \
            f"{sched}: stage 0 ran {counts} forwards before its first backward per step (want {want})"
        import json
        ctr = [e for e in json.load(open(t))["traceEvents"] if e.get("ph") == "C" and e["pid"] == pid]
        assert any(e["name"] == "object store high-water" for e in ctr), "no object-store counter in the trace"
        print(f"{sched}: stage 0 ran {counts[0]} forwards before its first backward (S={S}, M={M})")
    peak = {k: v[2]["peak_intermediate_bytes"] for k, v in got.items()}
    store = {k: v[2]["peak_store_bytes"] for k, v in got.items()}
    assert len(peak["gpipe"]) == S and all(b > 0 for b in peak["gpipe"] + peak["1f1b"]), peak
    ratio = peak["1f1b"][0] / peak["gpipe"][0]
    print(f"stage 0 peak intermediate bytes: 1f1b {peak['1f1b'][0]:.0f} / gpipe {peak['gpipe'][0]:.0f} = {ratio:.3f}; "
          f"object-store high-water per stage: gpipe {store['gpipe']} 1f1b {store['1f1b']}")
    assert peak["1f1b"][0] < peak["gpipe"][0], f"1F1B holds no less than GPipe on stage 0: {peak}"
    assert got["gpipe"][2]["weights_hash"] == got["1f1b"][2]["weights_hash"], "gpipe and 1f1b weights differ"


def case_checkpoints_cross_trainers():
    ref = train(2, "ref", ["--dp", "2"])
    # spmd_train is killed after its step-4 checkpoint; pathways_train resumes from it.
    ck = os.path.join(launch.TMP, "a.ckpt")
    p = run(2, TINY + ["--dp", "2", "--ckpt", ck, "--ckpt-every", "2", "--kill-step", "5", "--kill-rank", "1"],
            expect_ok=False)
    assert p.returncode != 0
    got = train(3, "pw_resumed", ["--dp", "2", "--ckpt", ck, "--ckpt-every", "2", "--resume", "--granularity", "chained"],
                exe="pathways")
    assert min(got[0]) == 4, f"pathways resumed at {min(got[0])}"
    for s in got[0]:
        for k in FIELDS:
            assert got[0][s][k] == ref[0][s][k], f"step {s} {k} differs after resuming in pathways_train"
    assert got[2]["weights_hash"] == ref[2]["weights_hash"]
    # pathways_train is killed after its step-4 checkpoint; spmd_train resumes from it.
    ck2 = os.path.join(launch.TMP, "b.ckpt")
    p = run(3, TINY + ["--dp", "2", "--ckpt", ck2, "--ckpt-every", "2", "--kill-step", "5"], expect_ok=False,
            exe="pathways")
    assert p.returncode != 0
    got = train(2, "spmd_resumed", ["--dp", "2", "--ckpt", ck2, "--resume"])
    assert min(got[0]) == 4, f"spmd resumed at {min(got[0])}"
    assert got[2]["weights_hash"] == ref[2]["weights_hash"], "resuming a pathways checkpoint in spmd_train diverged"
    print("checkpoints resume bitwise across the two trainers")


MOE = ["--dp", "2", "--expert-parallel", "2", "--experts", "4", "--top-k", "2", "--moe-every", "1"]
CAPACITY = ["--capacity-factor", "1.25"]
DROPLESS = ["--capacity-factor", "0"]


def case_moe_routings_equal_spmd():
    # The three routings of an MoE layer's expert calls (docs/pathways_train_moe.md) against spmd_train
    # on the same devices: static capacity against SPMD's capacity, both dropless routings against
    # SPMD's dropless, bitwise; the routing figures equal; the controller's round trips per step,
    # as the runtime counted them, one per MoE layer and micro-batch with controller, none else.
    mb = ["--microbatches", "2"]
    runs = (("static", CAPACITY, ("fused", "chained", "opbyop")),
            ("worker", DROPLESS, ("fused", "chained", "opbyop")),
            ("controller", DROPLESS, ("chained", "opbyop")))
    for routing, cap, grans in runs:
        ref = train(2, "moe_spmd_" + routing, MOE + cap + mb)
        for g in grans:
            got = train(3, f"moe_{routing}_{g}", MOE + cap + mb + ["--granularity", g, "--moe-routing", routing],
                        exe="pathways")
            assert_bitwise(ref, got, f"pathways {g} --moe-routing {routing}")
            want = 2 * 2 if routing == "controller" else 0  # micro-batches x MoE layers
            for st in got[0]:
                m, r = got[0][st]["moe"], ref[0][st]["moe"]
                for k in ("dropped_share", "padding_share", "max_mean_tokens", "device_max_mean", "lb_loss", "z_loss"):
                    assert m[k] == r[k], f"{routing} {g}: step {st} moe {k}: {m[k]} vs spmd {r[k]}"
                assert m["round_trips"] == want, f"{routing} {g}: step {st}: {m['round_trips']} round trips, not {want}"
    # --moe-routing auto is static under a capacity, worker when dropless (no round trip).
    got = train(3, "moe_auto", MOE + DROPLESS + ["--granularity", "chained"], exe="pathways")
    assert all(got[0][st]["moe"]["round_trips"] == 0 for st in got[0])


def case_moe_checkpoints_cross_trainers():
    # A checkpoint holds whole tensors (every expert) whichever trainer wrote it under
    # --expert-parallel 2: pathways_train's resumes in spmd_train and the reverse, bitwise.
    ref = train(2, "moe_ref", MOE + CAPACITY)
    for writer, reader in (("pathways", "spmd"), ("spmd", "pathways")):
        ck = os.path.join(launch.TMP, f"moe_{writer}.ckpt")
        n = 3 if writer == "pathways" else 2
        p = run(n, TINY + MOE + CAPACITY + ["--ckpt", ck, "--ckpt-every", "2", "--kill-step", "5",
                                                   "--kill-rank", "1"], expect_ok=False, exe=writer)
        assert p.returncode != 0 and os.path.exists(ck), f"{writer}: no step-4 checkpoint"
        extra = ["--granularity", "chained"] if reader == "pathways" else []
        got = train(3 if reader == "pathways" else 2, f"moe_{reader}_resumed", MOE + CAPACITY + extra +
                    ["--ckpt", ck, "--resume"], exe=reader)
        assert min(got[0]) == 4, f"{reader} resumed at {min(got[0])}"
        for st in got[0]:
            for k in FIELDS:
                assert got[0][st][k] == ref[0][st][k], f"{reader} after {writer}'s checkpoint: step {st} {k} differs"
        assert got[2]["weights_hash"] == ref[2]["weights_hash"], f"{reader} resuming {writer}'s MoE checkpoint diverged"
    print("MoE checkpoints resume bitwise across the two trainers")


def case_moe_expert_island_equals_spmd():
    # --expert-island (docs/pathways_train_moe.md): the experts on an island of their own (--islands 2x2:
    # the dense slice's two devices, then the two experts' devices), the rows crossing as the
    # program's transfers. Against spmd_train's --dp 2 --expert-parallel 2, bitwise: static (a
    # capacity), worker and controller (dropless) routing, chained and opbyop; the routing figures
    # equal and the controller's round trips counted. Then a checkpoint written so (every expert gathered from its device)
    # resumes on the island, and the run ends as the uninterrupted spmd_train run.
    mb = ["--microbatches", "2"]
    isl = ["--expert-island", "--islands", "2x2"]
    refs = {}
    for routing, cap in (("static", CAPACITY), ("worker", DROPLESS), ("controller", DROPLESS)):
        ref = refs[routing] = train(2, "isl_spmd_" + routing, MOE + cap + mb)
        for g in ("chained", "opbyop"):
            got = train(5, f"isl_{routing}_{g}", MOE + cap + mb + isl + ["--granularity", g, "--moe-routing", routing],
                        exe="pathways")
            assert_bitwise(ref, got, f"pathways {g} --expert-island --moe-routing {routing}")
            for st in got[0]:
                m, r = got[0][st]["moe"], ref[0][st]["moe"]
                for k in ("dropped_share", "padding_share", "max_mean_tokens", "device_max_mean", "lb_loss", "z_loss"):
                    assert m[k] == r[k], f"island {routing} {g}: step {st} moe {k}: {m[k]} vs spmd {r[k]}"
                # The controller's: one per MoE layer, micro-batch and experts' device, as the runtime counted.
                want = 2 * 2 * 2 if routing == "controller" else 0
                assert m["round_trips"] == want, f"island {routing} {g}: step {st}: {m['round_trips']} round trips"
    ck = os.path.join(launch.TMP, "isl.ckpt")
    run = MOE + CAPACITY + mb + isl + ["--granularity", "chained", "--ckpt", ck]
    p = launch.run(5, TINY + run + ["--ckpt-every", "2", "--kill-step", "5", "--kill-rank", "1"], expect_ok=False,
                   exe="pathways")
    assert p.returncode != 0 and os.path.exists(ck), "--expert-island: no step-4 checkpoint"
    got = train(5, "isl_resumed", run + ["--resume"], exe="pathways")
    assert min(got[0]) == 4, f"--expert-island resumed at {min(got[0])}"
    ref = refs["static"]
    for st in got[0]:
        for k in FIELDS:
            assert got[0][st][k] == ref[0][st][k], f"--expert-island resumed: step {st} {k} differs"
    assert got[2]["weights_hash"] == ref[2]["weights_hash"], "--expert-island resumed from its checkpoint diverged"
    print("--expert-island: bitwise spmd_train's at every routing, chained and opbyop, and resumed")


def case_moe_bad_settings_are_one_line():
    m = os.path.join(launch.TMP, "moe_bad.jsonl")
    bad = (
        (MOE + DROPLESS + ["--moe-routing", "static"], "--moe-routing static needs a capacity"),
        (MOE + CAPACITY + ["--moe-routing", "controller"], "--moe-routing controller routes dropless layers"),
        (MOE + CAPACITY + ["--moe-routing", "worker"], "--moe-routing worker routes dropless layers"),
        (MOE + DROPLESS + ["--moe-routing", "controller", "--granularity", "fused"], "needs --granularity chained or"),
        (["--dp", "2", "--moe-routing", "worker"], "applies to Mixture-of-Experts models"),
        (MOE + ["--moe-routing", "bogus"], "--moe-routing"),
        (["--experts", "4", "--stages", "2"], "on one slice"),
        (["--dp", "2", "--expert-island", "--granularity", "chained"], "--expert-island applies to Mixture-of-Experts models"),
        (MOE + CAPACITY + ["--expert-island"], "--expert-island needs --granularity chained or opbyop"),
        (["--experts", "4", "--dp", "2", "--expert-island", "--granularity", "chained"],
         "--expert-island needs --expert-parallel equal to --dp"),
        (MOE + CAPACITY + ["--expert-island", "--granularity", "chained"], "--expert-island needs 4 workers"),
    )
    for args, pattern in bad:
        expect_error(3, TINY + args + ["--metrics", m], pattern, [m], exe="pathways")


def case_bad_inputs_fail_cleanly():
    m = os.path.join(launch.TMP, "bad.jsonl")
    expect_error(3, TINY + ["--dp", "3", "--metrics", m], "--dp 3 x --tp 1 = 3 ranks", [m], exe="pathways")
    expect_error(3, TINY + ["--layers", "4", "--stages", "3", "--metrics", m], "--stages 3 needs 3 workers", [m],
                 exe="pathways")
    expect_error(3, TINY + ["--stages", "3", "--metrics", m], "each stage needs a layer", [m], exe="pathways")
    expect_error(3, TINY + ["--stages", "2", "--dp", "2", "--metrics", m], "needs 4 workers", [m],
                 exe="pathways")
    expect_error(3, TINY + ["--granularity", "bogus"], "granularity", exe="pathways")
    expect_error(3, TINY + ["--dp", "2", "--data", "/nonexistent/x.txt"], "/nonexistent/x.txt", exe="pathways")


def case_trace_has_controller_and_workers():
    import json
    t = os.path.join(launch.TMP, "t.json")
    train(3, "traced", ["--dp", "2", "--granularity", "chained", "--trace", t], exe="pathways")
    ev = json.load(open(t))["traceEvents"]
    pids = {e["pid"] for e in ev}
    assert pids == {0, 1, 2}, f"trace rows {pids}"
    names = {e["name"] for e in ev}
    for n in ("dispatch step", "block_fwd", "block_bwd", "update", "dp_allreduce"):
        assert any(x.startswith(n) for x in names), f"trace lacks {n}: {sorted(names)}"


def case_fused_first_bucket_overlaps_backward():
    # Issue 18: the fused kernel runs the same BucketedAllreduce as spmd_train (rows 1 and 2 are
    # the workers; harness.checks.check_overlap also runs the one-bucket control).
    def traced(name, extra):
        t = os.path.join(launch.TMP, f"overlap_{name}.json")
        train(3, "overlap_" + name, ["--dp", "2", "--granularity", "fused", "--trace", t] + extra, exe="pathways")
        return t
    check_overlap(traced, (1, 2), "pathways_train fused --dp 2")


# ---- Issue 17: the testing hooks, the pre-run check and checked writes in pathways_train --------


def case_kill_rank_and_step_sleep_are_honoured():
    m = os.path.join(launch.TMP, "k.jsonl")
    # A worker killed in the middle of step 1: the job ends non-zero (the old code ignored
    # --kill-rank and exited 0) and no metrics file is moved into place.
    p = run(3, TINY + ["--dp", "2", "--kill-step", "1", "--kill-rank", "1", "--metrics", m], expect_ok=False,
            exe="pathways", timeout=180)
    assert p.returncode != 0, "a run whose worker was killed exited 0"
    assert not os.path.exists(m), "the killed run left a metrics file"
    # (Temporary files are not checked here: OpenMPI ends the other ranks with SIGTERM, whose
    # handler removes them, but MPICH's Hydra with SIGKILL, which nothing can catch.)
    expect_error(3, TINY + ["--dp", "2", "--kill-step", "1", "--kill-rank", "3"], "--kill-rank 3", exe="pathways")
    # --step-sleep-ms paces the run so that an outside SIGTERM of the controller finds it in
    # progress; the controller's handler then removes its temporary metrics file.
    sub = os.path.join(launch.TMP, "sleep")  # apart from what the SIGKILLed run above may have left
    os.makedirs(sub)
    m2 = os.path.join(sub, "sleep.jsonl")
    cmd = MPIRUN + [NP_FLAG, "3", trainer("pathways")] + TINY + [
        "--dp", "2", "--steps", "60", "--step-sleep-ms", "500", "--metrics", m2]
    log = os.path.join(launch.TMP, "sleep.log")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=launch.ENV, stdout=out, stderr=subprocess.STDOUT)
    tmp = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            tmp = temp_leftovers(sub)
            try:
                if tmp and sum(1 for _ in open(tmp[0])) >= 3:  # the header and two steps
                    break
            except FileNotFoundError:
                # Gone since the glob: the start-up check's probe (the same temporary name, made
                # and removed at once: common/atomic_file.h) or the job's end (the poll sees it).
                pass
            time.sleep(0.05)
        assert proc.poll() is None, (f"the run ended before it could be stopped (--step-sleep-ms ignored?), exit "
                                     f"{proc.returncode}:\n{open(log).read()[-3000:]}")
        assert tmp, "the metrics file's temporary file never appeared"
        os.kill(int(tmp[0].rsplit(".", 1)[1]), signal.SIGTERM)
        assert proc.wait(timeout=120) != 0, "the job exited 0 after a SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not temp_leftovers(sub), f"temporary files left after SIGTERM: {temp_leftovers(sub)}"
    assert not os.path.exists(m2)


def case_outputs_and_config_checked_first():
    # PWM_PW_TRACE (the runtime's trace, written at shutdown) into a missing directory: named
    # before training (the old code failed after the whole run).
    env = launch.ENV
    launch.ENV = dict(env, PWM_PW_TRACE=os.path.join(launch.TMP, "missing", "rt.json"))
    try:
        p = run(3, TINY + ["--dp", "2"], expect_ok=False, exe="pathways")
    finally:
        launch.ENV = env
    one_error_line(p, "PWM_PW_TRACE", prefix="pathways_train: error:")
    assert "step" not in p.stdout, f"the run trained before failing:\n{p.stdout}"
    d = os.path.join(launch.TMP, "adir")
    os.makedirs(d)
    p = run(3, TINY + ["--dp", "2", "--ckpt", d], expect_ok=False, exe="pathways")
    one_error_line(p, f"--ckpt {d} is a directory", prefix="pathways_train: error:")
    # The controller and the workers parse the flags each: a worker with another --seed is named.
    a = TINY + ["--dp", "2", "--steps", "2"]
    p = mpmd([(2, a), (1, a + ["--seed", "9"])], exe="pathways")
    one_error_line(p, "rank 2 started with other flags than rank 0", prefix="pathways_train: error:")
    p = mpmd([(1, a + ["--granularity", "chained"]), (2, a)], exe="pathways")
    one_error_line(p, "granularity", prefix="pathways_train: error:")


def case_full_disk_leaves_nothing():
    full = small_tmpfs("full")
    subprocess.run(["dd", "if=/dev/zero", f"of={full}/fill", "bs=4k"], capture_output=True)
    m = os.path.join(full, "m.jsonl")
    p = run(3, TINY + ["--dp", "2", "--steps", "2", "--metrics", m], expect_ok=False, exe="pathways")
    assert p.returncode != 0, "a run on a full disk exited 0"
    assert "No space left on device" in p.stderr, p.stderr[-2000:]
    assert not os.path.exists(m) and not temp_leftovers(full), "an output or a temporary file was left"
    # A checkpoint larger than the filesystem, written by a worker's save kernel: its error
    # reaches the controller, which ends the job; neither output appears, no temporary is left.
    small = small_tmpfs("small")
    ck, m2 = os.path.join(small, "c.ckpt"), os.path.join(launch.TMP, "m2.jsonl")
    p = run(3, TINY + ["--dp", "2", "--steps", "2", "--ckpt", ck, "--metrics", m2], expect_ok=False, exe="pathways")
    assert p.returncode != 0 and f"checkpoint {ck}" in p.stderr and "No space left on device" in p.stderr, p.stderr[-2000:]
    assert not os.path.exists(ck) and not os.path.exists(m2), "an output was left under its final name"
    assert not temp_leftovers(small) and not temp_leftovers(launch.TMP), "temporary files left"


def case_mfu_never_over_one():
    # Issue 39: the workers' model-shape probes through the runtime; a pipeline's devices too.
    check_mfu_never_over_one(3, ["--dp", "2", "--granularity", "chained"], "pathways", "chained_dp2")
    check_mfu_never_over_one(3, ["--stages", "2", "--islands", "2x1", "--microbatches", "2"], "pathways",
                             "pipeline_s2")


def case_nonfinite_stops_the_run():
    # As spmd_train (tests/spmd, nonfinite_stops_the_run): the controller sees the step's loss
    # with up to two later steps in flight; the run still ends at the first non-finite step, no
    # evaluation or checkpoint after it, the workers released and every rank non-zero.
    check_nonfinite_stop(3, ["--replicas", "2"], "pathways", "pw_diverged_replicas")
    check_nonfinite_stop(3, ["--dp", "2", "--granularity", "chained"], "pathways", "pw_diverged_chained")
    # --skip-nonfinite: the skipped step passes the state through on every worker, as spmd_train
    # skips its update: the same bits.
    ref = nan_step_runs(2, ["--dp", "2"], "spmd", "spmd_nan")
    for mesh in (["--dp", "2", "--granularity", "fused"], ["--dp", "2", "--granularity", "chained"],
                 ["--dp", "2", "--granularity", "opbyop"], ["--replicas", "2"]):
        got = train(3, "pw_nan" + "".join(mesh), mesh + ["--nan-step", "2", "--skip-nonfinite", "1"], exe="pathways")
        assert got[2]["skipped_nonfinite"] == 1 and got[0][2]["skipped"] and got[0][2]["loss"] is None, got[0][2]
        assert_bitwise(ref, got, f"pathways {' '.join(mesh)} --nan-step 2 --skip-nonfinite 1")
    # The pipeline: every stage skips (the norm is the whole model's; the last stage also has the
    # loss), so the run stops or skips as the others.
    nan_step_runs(3, ["--stages", "2", "--microbatches", "2"], "pathways", "pw_nan_pipe")


def case_mid_run_evaluation_holds_no_memory():
    # Issue 58: a step of units binds the object store's buffers, and an evaluation in the middle
    # of the run used the workspace's own activations, resident from then on beside the step's
    # cached buffers (+59 MiB a rank in compare.sh --moe --full's pw_static row). It now runs in
    # buffers of the step's sizes from the cache: the run's peak with an evaluation at step 2
    # stays that of the same run evaluating at its end only (whose final evaluation comes after
    # the peak is read). The model's activations are ~90 MiB a micro-batch here, a peak of ~300.
    model = ["--d-model", "256", "--layers", "4", "--heads", "4", "--head-dim", "64", "--d-ff", "1024",
             "--seq-len", "256", "--batch", "8", "--steps", "4", "--eval-batches", "1", "--log-every", "100",
             "--peak-gflops", "50", "--dp", "2", "--granularity", "chained"]
    for exe, n in (("pathways", 3), ("static", 2)):
        peak, val = {}, {}
        for every in (2, 100):
            path = os.path.join(launch.TMP, f"eval_mem_{exe}_{every}.jsonl")
            run(n, model + ["--eval-every", str(every), "--metrics", path], exe=exe, timeout=300)
            _, vals, final = metrics(path)
            peak[every], val[every] = final["peak_rss_bytes"], vals[max(vals)]
        print(f"{exe} chained: peak RSS {peak[2] / 2**20:.1f} MiB evaluating at step 2, {peak[100] / 2**20:.1f} at the end only")
        assert val[2] == val[100], f"{exe}: the final validation loss moved with a mid-run evaluation: {val}"
        assert peak[2] <= 1.04 * peak[100], \
            f"{exe} chained: peak RSS {peak[2] / 2**20:.0f} MiB with an evaluation at step 2, {peak[100] / 2**20:.0f} without"


def case_island_evaluation_holds_one_layer_of_rows():
    # Issue 58: an experts' island's dense device keeps no expert rows in its step (its experts'
    # devices do), but its evaluation runs the whole model: it gave every MoE layer its own rows,
    # and expert_merge took each experts' device's whole state array. Now one MoE state serves
    # every layer (a forward keeps nothing for a backward) and each experts' device sends its
    # experts' ranges only: what a mid-run evaluation adds to the dense devices' peak is at most
    # one layer's received rows, the merged parameters and the P packed ranges (+25%: the heap's
    # and the other MPI's slack). Measured on a Zen 5, 2026-12-07: 80 MiB against a bound of 97;
    # before the change (every MoE layer's rows and P + 1 whole arrays) 130.
    C, F, E, K, P, B, T, cf, moe_layers = 256, 1024, 4, 2, 2, 4, 256, 1.25, 2
    model = ["--d-model", str(C), "--layers", "4", "--heads", "4", "--head-dim", "64", "--d-ff", str(F),
             "--seq-len", str(T), "--batch", str(2 * B), "--steps", "4", "--eval-batches", "1", "--log-every", "100",
             "--peak-gflops", "50", "--dp", "2", "--experts", str(E), "--top-k", str(K), "--moe-every", "2",
             "--expert-parallel", str(P), "--capacity-factor", str(cf), "--router-skew", "0",
             "--expert-island", "--granularity", "chained"]
    dense, val, state = {}, {}, 0
    for every in (2, 100):
        path = os.path.join(launch.TMP, f"island_eval_mem_{every}.jsonl")
        run(5, model + ["--eval-every", str(every), "--metrics", path], exe="pathways", timeout=300)
        _, vals, final = metrics(path)
        dense[every], val[every] = max(final["peak_resident_bytes_per_device"][:2]), vals[max(vals)]
        state = final["state_bytes"]
    El = E // P
    rows = P * El * math.ceil(cf * K * B * T / E)  # a dense device's received rows in one MoE layer
    bound = 1.25 * 4 * (rows * (C + 3 * F) + state / 16 + P * moe_layers * El * 3 * F * C)
    added = dense[2] - dense[100]
    print(f"dense devices: peak RSS {dense[2] / 2**20:.1f} MiB evaluating at step 2, {dense[100] / 2**20:.1f} at the "
          f"end only: {added / 2**20:.1f} added, bound {bound / 2**20:.1f}")
    assert val[2] == val[100], f"the final validation loss moved with a mid-run evaluation: {val}"
    assert added <= bound, f"a mid-run evaluation added {added / 2**20:.0f} MiB to the dense devices, over {bound / 2**20:.0f}"


if __name__ == "__main__":
    case_main(globals(), "pw")
