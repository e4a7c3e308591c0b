#!/usr/bin/env python3
"""Independent reader of pwm checkpoints, written from docs/checkpoint-format.md alone.

Standard library only. It verifies the magic, the version, the section sizes and the CRC-32,
decodes every tensor, and prints one line per tensor. With --dump OUT it also writes a JSON file

  {"config": {...}, "step": N, "train_config": "...", "crc32": N,
   "tensors": [{"group": "params", "name": ..., "shape": [...],
                "values": ["0x1.8p+1", ...],   # float.hex() of each float32 as Python decodes it
                "bits": [1069547520, ...]}]}   # the raw little-endian uint32 of each value

which tests/model/test_checkpoint.cc compares with the values the C++ side wrote.

usage: read_checkpoint.py CHECKPOINT [--dump OUT.json]
Exit status 0 if the file is valid, 1 (with one line on stderr) if not.
"""

import json
import struct
import sys
import zlib

MAGIC = b"PWMCKPT\x00"
VERSION = 1
PREAMBLE = struct.Struct("<8sIIQQ")  # magic, version, header_bytes, data_offset, data_bytes
ALIGN = 64
GROUPS = ("params", "adam_m", "adam_v")


class Invalid(Exception):
    pass


def read_checkpoint(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < PREAMBLE.size + 4:
        raise Invalid(f"truncated: {len(data)} bytes")
    magic, version, header_bytes, data_offset, data_bytes = PREAMBLE.unpack_from(data, 0)
    if magic != MAGIC:
        raise Invalid(f"bad magic {magic!r}")
    if version != VERSION:
        raise Invalid(f"format version {version}, this reader knows {VERSION}")
    header_end = PREAMBLE.size + header_bytes
    if data_offset % ALIGN or not header_end <= data_offset < header_end + ALIGN:
        raise Invalid(f"inconsistent header_bytes {header_bytes} / data_offset {data_offset}")
    expected = data_offset + data_bytes + 4
    if len(data) != expected:
        raise Invalid(f"size {len(data)} bytes, the preamble says {expected}")
    (stored,) = struct.unpack_from("<I", data, len(data) - 4)
    computed = zlib.crc32(data[: len(data) - 4]) & 0xFFFFFFFF
    if stored != computed:
        raise Invalid(f"checksum mismatch: stored {stored:08x}, computed {computed:08x}")
    if any(data[header_end:data_offset]):
        raise Invalid("non-zero padding after the header")

    header = json.loads(data[PREAMBLE.size : header_end].decode("utf-8"))
    if header.get("format") != "pwm-checkpoint" or header.get("version") != VERSION:
        raise Invalid("header format/version fields are wrong")
    tensors = []
    for e in header["tensors"]:
        if e["group"] not in GROUPS or e["dtype"] != "float32":
            raise Invalid(f"tensor {e['name']}: group {e['group']} dtype {e['dtype']}")
        n = 1
        for d in e["shape"]:
            n *= d
        offset, nbytes = e["offset"], e["bytes"]
        if nbytes != 4 * n or offset % ALIGN or offset + nbytes > data_bytes:
            raise Invalid(f"tensor {e['name']}: offset {offset} bytes {nbytes} shape {e['shape']}")
        start = data_offset + offset
        tensors.append(
            {"group": e["group"], "name": e["name"], "shape": e["shape"],
             "values": struct.unpack_from(f"<{n}f", data, start),
             "bits": struct.unpack_from(f"<{n}I", data, start)})
    return {"config": header["config"], "step": header["step"],
            "train_config": header["train_config"], "crc32": stored, "tensors": tensors}


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--dump"):
        print("usage: read_checkpoint.py CHECKPOINT [--dump OUT.json]", file=sys.stderr)
        return 2
    path = argv[1]
    try:
        ckpt = read_checkpoint(path)
    except (OSError, Invalid, ValueError, KeyError, TypeError, struct.error) as e:
        print(f"read_checkpoint.py: {path}: {e}", file=sys.stderr)
        return 1
    print(f"{path}: step {ckpt['step']}, crc32 {ckpt['crc32']:08x}, config {ckpt['config']}")
    for t in ckpt["tensors"]:
        print(f"  {t['group']:7} {t['name']:24} {t['shape']}")
    if len(argv) == 4:
        for t in ckpt["tensors"]:
            t["values"] = [v.hex() for v in t["values"]]
            t["bits"] = list(t["bits"])
        with open(argv[3], "w") as f:
            json.dump(ckpt, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
