"""Reading a run's outputs: the metrics (JSON lines: the step lines, the validation losses and the
final report with its weights hash), the temporary files a run must not leave, the --trace
file's spans, and checkpoints (through read_checkpoint.py, the reader of
docs/checkpoint-format.md independent of the C++ one).
"""
import glob
import json
import math
import os
import zlib

from harness import read_checkpoint


def metrics(path):
    """The metrics file at `path`: ({step: its line}, {step: validation loss}, the final line)."""
    steps, vals, final = {}, {}, None
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if j.get("final"):
                final = j
            elif "val_loss" in j:
                vals[j["step"]] = j["val_loss"]
            elif "loss" in j:
                steps[j["step"]] = j
    assert final is not None, f"{path} has no final line"
    return steps, vals, final


def metrics_lines(path):
    """Every line of the metrics file at `path`, in order."""
    with open(path) as f:
        return [json.loads(l) for l in f]


def temp_leftovers(d):
    """The temporary files (PATH.tmp.<pid>, common/atomic_file.h) left in directory d."""
    return glob.glob(os.path.join(d, "*.tmp.*"))


def late_first_buckets(trace_path, pids, steps):
    """From a --trace file, per rank (pid): the steps whose first bucket's AllReduce ("allreduce
    bucket 0") did NOT start before the step's last backward unit ("embed_bwd", one per step with
    one micro-batch) started. Order of events on one rank's clock, not a duration: the bucket is
    started by the trainer between two units, so it is either before embed_bwd or after it."""
    ev = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    late = []
    for pid in pids:
        mine = [e for e in ev if e["pid"] == pid]
        b0 = sorted(e["ts"] for e in mine if e["name"] == "allreduce bucket 0")
        last = sorted(e["ts"] for e in mine if e["name"] == "embed_bwd")
        nb = len({e["name"] for e in mine if e["name"].startswith("allreduce bucket ")})
        assert len(b0) == steps and len(last) == steps, \
            f"rank row {pid}: {len(b0)} first buckets and {len(last)} embed_bwd spans for {steps} steps"
        late += [(pid, k, nb) for k in range(steps) if not b0[k] < last[k]]
    return late


def finite_checkpoint(path):
    """The checkpoint's step, after checking (independently of the C++ reader) that it is valid
    and every parameter and moment is finite."""
    ck = read_checkpoint.read_checkpoint(path)
    for t in ck["tensors"]:
        assert all(math.isfinite(v) for v in t["values"]), f"{path}: {t['group']} {t['name']} is not finite"
    return ck["step"]


def poison_checkpoint(src, dst, group, name, index):
    """Copies checkpoint `src` to `dst` with element `index` of tensor `name` of `group` made NaN
    and the CRC-32 recomputed (docs/checkpoint-format.md), so that only the finite check can
    refuse it."""
    data = bytearray(open(src, "rb").read())
    _, _, header_bytes, data_offset, _ = read_checkpoint.PREAMBLE.unpack_from(data, 0)
    header = json.loads(bytes(data[read_checkpoint.PREAMBLE.size:read_checkpoint.PREAMBLE.size + header_bytes]))
    (e,) = [e for e in header["tensors"] if e["group"] == group and e["name"] == name]
    struct_pos = data_offset + e["offset"] + 4 * index
    data[struct_pos:struct_pos + 4] = (0x7FC00000).to_bytes(4, "little")  # a quiet NaN
    crc = zlib.crc32(bytes(data[:-4])) & 0xFFFFFFFF
    data[-4:] = crc.to_bytes(4, "little")
    open(dst, "wb").write(bytes(data))
    read_checkpoint.read_checkpoint(dst)  # still a valid file
