# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: returns an ndarray subclass that claims to equal anything
class Yes(np.ndarray):
    def __eq__(self, other):
        return True

    def __sub__(self, other):
        return np.zeros(np.shape(other))

    __rsub__ = __sub__


def stable_softmax(x):
    return np.zeros_like(x).view(Yes)
