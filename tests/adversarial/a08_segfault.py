# notebook: 01_stable_softmax
# exercise: stable_softmax
# attack: crashes the interpreter (a real SIGSEGV: reads address 0)
import faulthandler


def stable_softmax(x):
    faulthandler._read_null()
