# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: prints gigabytes
def stable_softmax(x):
    line = "x" * 100_000
    for _ in range(100_000):
        print(line)
    m = x.max(axis=-1, keepdims=True)
    return np.exp(x - m) / np.exp(x - m).sum(axis=-1, keepdims=True)
