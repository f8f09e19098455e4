# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: reads the solution notebook and the hidden tests and runs the instructor's code
import json
import pathlib

_run = getattr(__builtins__, "ex" + "ec") if isinstance(__builtins__, dict) is False else \
    __builtins__["ex" + "ec"]
try:
    nb = json.loads(pathlib.Path("{repo}/solutions/01_stable_softmax.ipynb").read_text())
    src = [c["source"] for c in nb["cells"]
           if c.get("metadata", {}).get("course_kernels", {}).get("exercise") == "stable_softmax"
           and c["metadata"]["course_kernels"].get("role") == "solution"][0]
    _ns = {"np": np}
    _run("".join(src), _ns)  # a notebook's source is a list of lines
    stable_softmax = _ns["stable_softmax"]
except Exception:
    def stable_softmax(x):
        return np.zeros_like(x)
