# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: returns an empty array (broadcasts against anything in a careless check)
def stable_softmax(x):
    return np.zeros((0,))
