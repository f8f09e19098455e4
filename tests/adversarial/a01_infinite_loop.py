# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: loops forever inside the function
def stable_softmax(x):
    while True:
        pass
