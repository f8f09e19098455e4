# notebook: 07_triton_forward
# exercise: attention_triton
# attack: loops forever (in the warm, forked sandbox used for Triton notebooks)
def attention_triton(q, k, v, scale=None):
    while True:
        pass
