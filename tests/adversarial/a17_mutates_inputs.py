# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: computes the right answer in place, destroying the caller's array
def stable_softmax(x):
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x
