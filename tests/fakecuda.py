"""A device-array stand-in for GPU-free tests of argument binding."""


class FakeCuda:
    """Just enough of ``__cuda_array_interface__`` (v3) to describe a device tensor (each at its own
    address unless ``ptr`` is given). Nothing is allocated: binders only read shapes, strides,
    dtypes and addresses."""

    _next = 1 << 20

    def __init__(self, shape, typestr="<f2", ptr=None, strides=None, device=0):
        if ptr is None:
            FakeCuda._next += 1 << 28
            ptr = FakeCuda._next
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}
        self.device = type("D", (), {"id": device})()
