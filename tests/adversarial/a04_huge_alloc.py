# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: asks for 256 TB at once
def stable_softmax(x):
    return np.empty((1 << 45,))
