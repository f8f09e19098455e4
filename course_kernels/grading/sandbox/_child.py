"""The sandboxed side of the grader: runs a student's code and returns results as data only.

This file is executed as a script by a fresh interpreter (``python -I -S _child.py REQUEST_DIR
RESULT_FD``) inside the bubblewrap sandbox set up by :mod:`.sandbox`. It imports
nothing from ``course_kernels`` (the package is not on this interpreter's path, and a poisoned
stand-in blocks it): the student must write the algorithm, not call the library's.

Protocol (read by ``frames._pump``): each frame on RESULT_FD is
``[4-byte header length][header JSON][8-byte payload length][payload]``; the payload is the
concatenation of ``.npy`` files (``np.save(..., allow_pickle=False)``). Never pickle.
"""

import contextlib
import hashlib
import io
import json
import linecache
import os
import struct
import sys
import time
import traceback

REQUEST: dict = {}
np = None  # numpy, imported by setup() once the request's sys.path is in place
_write = None
_dumps = json.dumps


def setup(request_dir: str, result_fd: int) -> None:
    """Read the request, give up privileges, block the course library, open the result channel."""
    global np, _write
    with open(os.path.join(request_dir, "request.json")) as f:
        REQUEST.update(json.load(f))
    sys.path[:0] = [p for p in REQUEST["sys_path"] if p not in sys.path]  # never the repository
    import numpy

    np = numpy
    _write = os.fdopen(result_fd, "wb", buffering=0).write
    sys.meta_path.insert(0, _BlockFinder)
    sys.modules["course_kernels"] = _Blocked()


def send(header, arrays=()):
    """One frame, written piece by piece: the arrays' bytes are never copied into one buffer
    (a copy would count against the submission's measured memory)."""
    pieces = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(a))
        pieces += [buf.getvalue(), memoryview(a.reshape(-1)).cast("B") if a.size else b""]
    header["blob_sizes"] = [len(pieces[i]) + len(pieces[i + 1]) for i in range(0, len(pieces), 2)]
    h = _dumps(header).encode()
    for p in [
        struct.pack("<I", len(h)) + h + struct.pack("<Q", sum(header["blob_sizes"]))
    ] + pieces:
        view = memoryview(p)
        while len(view):
            n = _write(view)
            view = view[n:]


class _Blocked:
    """Stand-in for ``course_kernels`` inside the sandbox: the graded algorithms are not here."""

    def __getattr__(self, name):
        raise ImportError(
            f"course_kernels.{name} is not available while grading: write the algorithm yourself"
        )


class _BlockFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "course_kernels" or name.startswith("course_kernels."):
            raise ImportError(
                f"{name} cannot be imported while grading: write the algorithm yourself"
            )
        return None


class SRAMOverflowError(RuntimeError):
    pass


class TraceMemory:
    """The grader's copy of ``course_kernels.iosim.TwoLevelMemory``'s interface, logging every op.

    The parent replays the log against the real simulator to count traffic and check capacity.
    """

    def __init__(self, sram_elements, **hbm):
        self.capacity = sram_elements
        self.hbm = {k: np.asarray(v) for k, v in hbm.items()}
        self.log = []
        self._ids = {}
        self._next = 0  # tile ids are never reused, however tiles are freed

    def _rows(self, arr, rows):
        return arr[rows] if arr.ndim == 1 else arr[..., rows, :]

    def _slice(self, name, rows):
        if name not in self.hbm:
            raise KeyError(f"no array named {name!r} in HBM; have {sorted(self.hbm)}")
        if not isinstance(rows, slice):
            raise TypeError(f"rows must be a slice such as slice(i0, i1); got {rows!r}")
        n = self.hbm[name].shape[-2] if self.hbm[name].ndim >= 2 else self.hbm[name].shape[-1]
        start, stop, step = rows.indices(n)
        if step != 1:
            raise ValueError(f"rows must be a contiguous slice; got step {step}")
        return start, stop

    def load(self, name, rows=slice(None), registers=False):
        start, stop = self._slice(name, rows)
        tile = np.array(self._rows(self.hbm[name], rows))
        self._ids[id(tile)] = self._next
        self._next += 1
        self.log.append(["load", name, start, stop, bool(registers), self._ids[id(tile)]])
        return tile

    def store(self, name, rows, tile=None):
        start, stop = self._slice(name, rows)
        if tile is None:
            raise ValueError(f"store to {name!r} needs data: this HBM array is real")
        self._rows(self.hbm[name], rows)[...] = tile
        self.log.append(["store", name, start, stop])

    def alloc(self, shape, fill=0.0, dtype="float64"):
        shape = tuple(int(s) for s in shape)
        tile = np.full(shape, fill, dtype=dtype)
        self._ids[id(tile)] = self._next
        self._next += 1
        self.log.append(["alloc", list(shape), self._ids[id(tile)]])
        return tile

    def free(self, *tiles):
        for t in tiles:
            if id(t) not in self._ids:
                raise ValueError("free() of a tile that is not resident in SRAM")
            self.log.append(["free", self._ids.pop(id(t))])


def _to_numpy(x):
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16",):
            x = x.float()
        x = x.numpy()
    return x


def _encode(value, arrays):
    """Outputs become data: arrays (float/int/bool dtypes only), ints, floats, bools, None, tuples."""
    value = _to_numpy(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, str):
            value = value[:200]
        return {"kind": "value", "value": value}
    if isinstance(value, (tuple, list)):
        if len(value) > 256:
            raise TypeError("returned a sequence of more than 256 items")
        return {"kind": "tuple", "items": [_encode(v, arrays) for v in value]}
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiub" and type(value) is np.ndarray:
        arrays.append(np.ascontiguousarray(value))
        return {"kind": "array"}
    raise TypeError(
        f"returned an object of type {type(value).__name__}; the grader accepts NumPy arrays, "
        "torch tensors, numbers and tuples of them"
    )


def _digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def main(request_dir):
    arrays = np.load(os.path.join(request_dir, "arrays.npz"), allow_pickle=False)
    arrays = {k: arrays[k] for k in arrays.files}
    needs_torch = any(c.get("torch") for c in REQUEST["calls"])
    torch = None
    if needs_torch:
        import torch  # noqa: F811
    launches = [0]
    if REQUEST.get("triton"):  # count kernel launches, interpreted or compiled
        import triton.runtime.interpreter as _interp
        import triton.runtime.jit as _jit

        for cls in (_interp.InterpretedFunction, _jit.JITFunction):

            def _counting(self, *a, _orig=cls.run, **kw):
                launches[0] += 1
                return _orig(self, *a, **kw)

            cls.run = _counting
    namespace = {"__name__": "__submission__"}
    exec(compile(REQUEST["preamble"], "<preamble>", "exec"), namespace)
    for cell in REQUEST["cells"]:
        send({"type": "cell_start", "exercise": cell["exercise"]})
        try:
            filename = f"<cell {cell['exercise']}>"
            # Triton's @jit reads a kernel's source through linecache, as from a Jupyter cell
            linecache.cache[filename] = (
                len(cell["source"]),
                None,
                cell["source"].splitlines(True),
                filename,
            )
            exec(compile(cell["source"], filename, "exec"), namespace)
            send({"type": "cell", "exercise": cell["exercise"], "ok": True})
        except BaseException as e:  # noqa: BLE001 - SystemExit from the cell included
            send(
                {
                    "type": "cell",
                    "exercise": cell["exercise"],
                    "ok": False,
                    "error": {
                        "type": type(e).__name__,
                        "message": str(e)[:500],
                        "traceback": traceback.format_exc(limit=-3)[-1500:],
                    },
                }
            )
    for call in REQUEST["calls"]:
        send({"type": "start", "call": call["id"]})
        args = [arrays[a["array"]] if "array" in a else a["value"] for a in call["args"]]
        kwargs = {
            k: (arrays[a["array"]] if "array" in a else a["value"])
            for k, a in call["kwargs"].items()
        }
        if call.get("torch"):
            args = [torch.from_numpy(a.copy()) if isinstance(a, np.ndarray) else a for a in args]
        before = [
            _digest(_to_numpy(a)) for a in args if isinstance(a, np.ndarray) or hasattr(a, "detach")
        ]
        launches[0] = 0
        header = {"type": "result", "call": call["id"]}
        out_arrays = []
        t0 = time.perf_counter()
        try:
            fn = namespace.get(call["func"])
            if fn is None:
                raise NameError(f"name {call['func']!r} is not defined in your solution cells")
            if call.get("io_sram") is not None:
                mem = TraceMemory(
                    call["io_sram"],
                    Q=args[0],
                    K=args[1],
                    V=args[2],
                    O=np.zeros((*args[0].shape[:-1], args[2].shape[-1]), args[0].dtype),
                    L=np.full(args[0].shape[:-1], -np.inf, args[0].dtype),
                )
                fn(mem, **kwargs)
                result = (mem.hbm["O"], mem.hbm["L"])
                header["trace"] = mem.log[:200000]
            else:
                result = fn(*args, **kwargs)
            header["seconds"] = time.perf_counter() - t0
            header["output"] = _encode(result, out_arrays)
            header["ok"] = True
        except BaseException as e:  # noqa: BLE001
            header["ok"] = False
            header["error"] = {
                "type": type(e).__name__,
                "message": str(e)[:500],
                "traceback": traceback.format_exc(limit=-3)[-1500:],
            }
        after = [
            _digest(_to_numpy(a)) for a in args if isinstance(a, np.ndarray) or hasattr(a, "detach")
        ]
        header["mutated"] = [
            i for i, (x, y) in enumerate(zip(before, after, strict=False)) if x != y
        ]
        header["launches"] = launches[0]
        send(header, out_arrays)
    send({"type": "done"})


def serve(request_dir: str, result_fd: int) -> None:
    with contextlib.suppress(OSError):  # a session (and process group) of its own
        os.setsid()
    setup(request_dir, result_fd)
    main(request_dir)
    # End now: a student's non-daemon thread or atexit hook must not keep the process (and its
    # peak memory, which the grader reads once the process tree has been reaped) alive.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
