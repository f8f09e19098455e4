# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: an exception message with lone surrogates (feedback and results must still be written)
def stable_softmax(x):
    raise ValueError("bad \ud800 value \udfff")
