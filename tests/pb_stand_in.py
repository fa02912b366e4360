"""A stand-in for the python backend's ``pb_utils.Tensor``, for unit tests that drive a
served python model without Triton (the real one exists only inside the stub)."""

import numpy as np


class Tensor:
    def __init__(self, name, value):
        self._name, self._value = name, np.asarray(value)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._value

    def shape(self):
        return self._value.shape

    def is_cpu(self):
        return True
