# notebook: 02_online_softmax
# exercise: online_update
# attack: not even Python
def online_update(m, l, acc, s, v)
    return m, l, acc
