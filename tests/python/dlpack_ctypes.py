"""DLPack structs in ctypes: a hand-made producer (to test capsule
ownership, devices and flags the big frameworks cannot produce on a CPU
machine) and a direct caller of the C API (bx_total_norm, bx_scale)."""
import ctypes as C


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class DLManagedTensor(C.Structure):
    pass


DELETER = C.CFUNCTYPE(None, C.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", C.c_void_p),
                            ("deleter", DELETER)]


class DLPackVersion(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32)]


class DLManagedTensorVersioned(C.Structure):
    pass


DELETER_V = C.CFUNCTYPE(None, C.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", C.c_void_p),
                                     ("deleter", DELETER_V), ("flags", C.c_uint64),
                                     ("dl_tensor", DLTensor)]

KDLCPU, KDLCUDA = 1, 2
KDLFLOAT, KDLBFLOAT, KDLINT = 2, 4, 0
DTYPE_CODES = {"float16": (KDLFLOAT, 16), "bfloat16": (KDLBFLOAT, 16),
               "float32": (KDLFLOAT, 32), "float64": (KDLFLOAT, 64)}

_PyCapsule_New = C.pythonapi.PyCapsule_New
_PyCapsule_New.restype = C.py_object
_PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
_PyCapsule_GetName = C.pythonapi.PyCapsule_GetName
_PyCapsule_GetName.restype = C.c_char_p
_PyCapsule_GetName.argtypes = [C.py_object]

_NAMES = {b"dltensor": C.c_char_p(b"dltensor"),
          b"dltensor_versioned": C.c_char_p(b"dltensor_versioned")}


def dltensor_of(ptr, shape, dtype, strides=None, device_type=KDLCPU):
    """A DLTensor over raw memory; returns (struct, keep-alive list)."""
    code, nbits = DTYPE_CODES[dtype] if isinstance(dtype, str) else dtype
    sh = (C.c_int64 * max(1, len(shape)))(*shape)
    st = (C.c_int64 * max(1, len(strides)))(*strides) if strides is not None else None
    t = DLTensor(C.c_void_p(ptr), DLDevice(device_type, 0), len(shape),
                 DLDataType(code, nbits, 1), sh,
                 C.cast(st, C.POINTER(C.c_int64)) if st is not None else None, 0)
    return t, [sh, st]


class Producer:
    """Exports a torch tensor's memory through a hand-built capsule and logs
    deleter calls. device_type / flags / versioned are configurable."""

    def __init__(self, tensor, device_type=KDLCPU, versioned=False, flags=0, dtype=None):
        self.tensor = tensor  # keeps the memory alive
        self.device_type, self.versioned, self.flags = device_type, versioned, flags
        self.dtype = dtype or str(tensor.dtype).replace("torch.", "")
        self.deleted = 0
        self.capsules = []
        self._keep = []

    def __dlpack__(self, **kwargs):
        t = self.tensor
        dl, keep = dltensor_of(t.data_ptr(), list(t.shape), self.dtype,
                               list(t.stride()), self.device_type)
        if self.versioned and kwargs.get("max_version"):
            m = DLManagedTensorVersioned()
            m.version = DLPackVersion(1, 0)
            m.flags = self.flags
            m.dl_tensor = dl

            @DELETER_V
            def deleter(_):
                self.deleted += 1
            m.deleter = deleter
            name = b"dltensor_versioned"
        else:
            m = DLManagedTensor()
            m.dl_tensor = dl

            @DELETER
            def deleter(_):
                self.deleted += 1
            m.deleter = deleter
            name = b"dltensor"
        self._keep += [m, keep, deleter]
        cap = _PyCapsule_New(C.addressof(m), _NAMES[name], None)
        self.capsules.append(cap)
        return cap


def capsule_name(cap):
    return _PyCapsule_GetName(cap).decode()


# ---- the C API, called directly -----------------------------------------

class BxGroup(C.Structure):
    _fields_ = [("tensors", C.POINTER(DLTensor)), ("count", C.c_size_t)]


class BxNormOpts(C.Structure):
    """bx_norm_opts, field for field (bitexact.h); struct_size leads."""
    _fields_ = [("struct_size", C.c_size_t), ("norm_type", C.c_double),
                ("error_if_nonfinite", C.c_int), ("num_threads", C.c_int), ("flavor", C.c_int),
                ("norm_dtype", C.c_int)]


def c_total_norm(lib, tensors, struct_size=None):
    """bx_total_norm over torch tensors through ctypes -> (status, norm).
    struct_size: what to put in opts.struct_size (default: the right one)."""
    keep, structs = [], []
    for t in tensors:
        dl, k = dltensor_of(t.data_ptr(), list(t.shape), str(t.dtype).replace("torch.", ""),
                            list(t.stride()))
        structs.append(dl)
        keep.append(k)
    arr = (DLTensor * max(1, len(structs)))(*structs)
    group = BxGroup(C.cast(arr, C.POINTER(DLTensor)), len(structs))
    size = C.sizeof(BxNormOpts) if struct_size is None else struct_size
    opts = BxNormOpts(size, 2.0, 0, 0, 0, 0)
    out = C.c_double(-1.0)
    lib.bx_total_norm.restype = C.c_int
    lib.bx_total_norm.argtypes = [C.POINTER(BxGroup), C.c_size_t, C.c_void_p,
                                  C.POINTER(BxNormOpts), C.POINTER(C.c_double), C.c_void_p]
    st = lib.bx_total_norm(C.byref(group), 1, None, C.byref(opts), C.byref(out), None)
    return st, out.value
