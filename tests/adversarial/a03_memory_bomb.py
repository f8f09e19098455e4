# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: allocates (and touches) memory without bound
def stable_softmax(x):
    hoard = []
    while True:
        hoard.append(np.ones(50_000_000))
