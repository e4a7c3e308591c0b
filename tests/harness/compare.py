"""Comparing two runs' metrics (as workloads.train returns them): bitwise (every deterministic
field of every step, the validation losses, the final weights hash) or, for another
decomposition of the same computation, loss curves within a relative tolerance (RTOL).
"""

def assert_close_curves(ref, got, rtol, what):
    """Loss curves agree step by step within rtol (relative)."""
    (rs, rv, _), (gs, gv, _) = ref, got
    assert sorted(rs) == sorted(gs), f"{what}: different steps"
    worst = 0.0
    for s in rs:
        a, b = rs[s]["loss"], gs[s]["loss"]
        worst = max(worst, abs(a - b) / abs(a))
        assert abs(a - b) <= rtol * abs(a), f"{what}: step {s} loss {b} vs {a} (rtol {rtol})"
    for s in rv:
        assert abs(rv[s] - gv[s]) <= rtol * abs(rv[s]), f"{what}: val loss at {s}: {gv[s]} vs {rv[s]}"
    print(f"{what}: max relative loss difference {worst:.2e} (tolerance {rtol})")


# Tolerance for another decomposition of the same computation. The gradients agree only to
# float rounding: dp changes the order of the AllReduce sum, tp the order of the block
# reductions, micro-batches the order of accumulation (relative differences ~1e-7 per
# operation, float32's epsilon). Over 6 AdamW steps the losses then differ by ~1e-7 relative
# (measured here: 5e-8 to 1e-7, printed by each case). 1e-5 leaves 100x margin and still
# catches any real error: a wrong scale or a missed reduction moves the loss by percents.
RTOL = 1e-5


# The fields of a step line that equal runs give the same bits (not its times).
DETERMINISTIC_FIELDS = ("step", "loss", "lr", "grad_norm")
FIELDS = ("step", "loss", "lr", "grad_norm")  # (the same, as pathways_train's cases name them)


def same_bits(a, b, what, fields=DETERMINISTIC_FIELDS):
    """Runs a and b bitwise equal: `fields` of every step of a, validation losses, final weights."""
    for s in a[0]:
        for k in fields:
            assert a[0][s][k] == b[0][s][k], f"{what}: step {s} {k}: {b[0][s][k]} vs {a[0][s][k]}"
    assert a[1] == b[1], f"{what}: validation losses differ"
    assert a[2]["weights_hash"] == b[2]["weights_hash"], f"{what}: final weights differ"
    print(f"{what}: bitwise equal")


def assert_bitwise(ref, got, what, ref_name="spmd_train"):
    """Runs ref (of `ref_name`) and got bitwise equal: the same steps, FIELDS of each, validation
    losses, final weights."""
    (rs, rv, rf), (gs, gv, gf) = ref, got
    assert sorted(rs) == sorted(gs), f"{what}: different steps {sorted(gs)}"
    for s in rs:
        for k in FIELDS:
            assert rs[s][k] == gs[s][k], f"{what}: step {s} {k}: {gs[s][k]!r} vs spmd {rs[s][k]!r}"
    assert rv == gv, f"{what}: validation losses {gv} vs spmd {rv}"
    assert rf["weights_hash"] == gf["weights_hash"], f"{what}: weights {gf['weights_hash']} vs spmd {rf['weights_hash']}"
    print(f"{what}: {len(rs)} steps, losses, gradient norms and final weights bitwise equal to {ref_name}")
