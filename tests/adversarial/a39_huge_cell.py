# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: a 3 MB solution cell (the harness pads it): the parent must not parse it unbounded
def stable_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
# {pad}
