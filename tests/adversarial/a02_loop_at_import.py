# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: loops forever while the cell itself runs (before any test)
while True:
    pass
