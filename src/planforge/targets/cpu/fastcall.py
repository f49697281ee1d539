"""The lean call path of a batch-1 plan: one native call from Python, its buffers taken in place.

A ctypes call costs a few hundred nanoseconds on its own, and getting an
array's address from Python (``x.ctypes.data``) as much again; at a 5 us
kernel that is a tenth of the call. This module builds (once per machine,
content-hash cached like every kernel) a tiny CPython extension whose
``Bound`` object calls a plan's C entry ``run(handle, in, out)`` directly:
it checks that ``x`` (and ``out``, when given) are numpy arrays, and through
the buffer protocol that they are C-contiguous fp32 of the plan's shapes and
do not overlap, and runs the
kernel on them in place, holding the GIL (the call is shorter than a release
and re-acquire). Anything else (another dtype, a strided view, a list, a
torch tensor) goes to the plan's own Python path, which converts and checks.

A plan of several native steps is made one native entry by ``chain``: a
small compiled runner that copies ``in`` into the plan's input slot, calls
each step's C function on its bound arguments in order, and copies the
output slot to ``out`` (two copies of a few hundred floats, against a
ctypes call per step and numpy's copies on the Python path).

``bound(fn_addr, handle, in_shape, out_shape, fallback, keep)`` returns the
callable, or None when the extension cannot be built here (no Python
headers, no compiler): the caller then keeps its ctypes path;
``unavailable()`` says why. The callable's ``kernel_time(x, out, n)`` times
the native entry alone, called ``n`` times from C on the same buffers: the
kernel's own time in this process, which a call's overhead is measured over.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import sysconfig
import threading
from pathlib import Path
from typing import Callable

import numpy as np

_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

typedef void (*run_fn)(void *, const float *, float *);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    run_fn fn;
    void *h;
    Py_ssize_t nin, nout;
    int din, dout;                /* ndim of the input and the output; their shapes follow */
    Py_ssize_t sin[8], sout[8];
    npy_intp oshape[8];
    PyObject *fallback, *keep, *only;  /* only: the one array type read in place (numpy's ndarray) */
} Bound;

/* a C-contiguous fp32 buffer of shape dims[0..nd), or -1 (nothing held, no error set) */
static int f32(PyObject *o, Py_buffer *b, int writable, Py_ssize_t n, int nd, const Py_ssize_t *dims) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) != 0) {
        PyErr_Clear();
        return -1;
    }
    const char *f = b->format ? b->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    int ok = b->itemsize == 4 && b->len == n * 4 && f[0] == 'f' && f[1] == 0 && b->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = b->shape && b->shape[i] == dims[i];
    if (!ok) {
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject *bound_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Bound *B = (Bound *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *x = n > 0 ? args[0] : NULL, *out = NULL;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nk; i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "out") == 0 && !out) out = args[n + i];
        else return PyObject_Vectorcall(B->fallback, args, nargsf, kwnames);
    }
    /* another type (a torch tensor exports a buffer too) goes back: its caller wants its own type returned */
    if (!x || n > 1 || (PyObject *)Py_TYPE(x) != B->only || (out && out != Py_None && (PyObject *)Py_TYPE(out) != B->only))
        return PyObject_Vectorcall(B->fallback, args, nargsf, kwnames);
    Py_buffer bx, by;
    if (f32(x, &bx, 0, B->nin, B->din, B->sin) != 0) return PyObject_Vectorcall(B->fallback, args, nargsf, kwnames);
    PyObject *y;
    if (out == NULL || out == Py_None) {
        y = PyArray_SimpleNew(B->dout, B->oshape, NPY_FLOAT32);  /* a fresh output, as numpy would make it */
        if (!y) { PyBuffer_Release(&bx); return NULL; }
    } else {
        Py_INCREF(out);
        y = out;
    }
    if (f32(y, &by, 1, B->nout, B->dout, B->sout) != 0) {
        PyBuffer_Release(&bx);
        Py_DECREF(y);
        return PyObject_Vectorcall(B->fallback, args, nargsf, kwnames);
    }
    const char *xa = (const char *)bx.buf, *ya = (const char *)by.buf;
    if (xa < ya + by.len && ya < xa + bx.len) {  /* overlapping: the kernel may read what it already wrote */
        PyBuffer_Release(&bx);
        PyBuffer_Release(&by);
        Py_DECREF(y);
        return PyObject_Vectorcall(B->fallback, args, nargsf, kwnames);
    }
    B->fn(B->h, (const float *)bx.buf, (float *)by.buf);
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    return y;
}

/* kernel_time(x, out, n): seconds per call of the native entry alone on x and out, n calls timed from C, in this
   process and on these buffers: what a call through bound_call adds is the difference */
static PyObject *bound_kernel_time(PyObject *self, PyObject *args) {
    Bound *B = (Bound *)self;
    PyObject *x, *out;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOn", &x, &out, &n)) return NULL;
    if (n < 1) { PyErr_SetString(PyExc_ValueError, "kernel_time: n must be at least 1"); return NULL; }
    Py_buffer bx, by;
    if (f32(x, &bx, 0, B->nin, B->din, B->sin) != 0) {
        PyErr_SetString(PyExc_TypeError, "kernel_time: x is not a C-contiguous fp32 array of the plan's input shape");
        return NULL;
    }
    if (f32(out, &by, 1, B->nout, B->dout, B->sout) != 0) {
        PyBuffer_Release(&bx);
        PyErr_SetString(PyExc_TypeError, "kernel_time: out is not a writable C-contiguous fp32 array of the plan's output shape");
        return NULL;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (Py_ssize_t i = 0; i < n; i++) B->fn(B->h, (const float *)bx.buf, (float *)by.buf);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    return PyFloat_FromDouble(((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)) / (double)n);
}

static PyMethodDef bound_methods[] = {
    {"kernel_time", bound_kernel_time, METH_VARARGS,
     "kernel_time(x, out, n): seconds per call of the kernel alone (n calls from C on x and out)"},
    {NULL, NULL, 0, NULL},
};

static int bound_init(PyObject *self, PyObject *args, PyObject *kw) {
    Bound *B = (Bound *)self;
    unsigned long long fn, h;
    PyObject *shin, *shout, *fallback, *keep, *only;
    if (!PyArg_ParseTuple(args, "KKO!O!OOO!", &fn, &h, &PyTuple_Type, &shin, &PyTuple_Type, &shout,
                          &fallback, &keep, &PyType_Type, &only)) return -1;
    B->din = (int)PyTuple_GET_SIZE(shin);
    B->dout = (int)PyTuple_GET_SIZE(shout);
    if (!fn || B->din > 8 || B->dout > 8) { PyErr_SetString(PyExc_ValueError, "Bound: a null entry or over 8 dims"); return -1; }
    B->nin = B->nout = 1;
    for (int i = 0; i < B->din; i++) { B->sin[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shin, i)); B->nin *= B->sin[i]; }
    for (int i = 0; i < B->dout; i++) {
        B->sout[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shout, i));
        B->oshape[i] = (npy_intp)B->sout[i];
        B->nout *= B->sout[i];
    }
    if (PyErr_Occurred()) return -1;
    B->fn = (run_fn)(uintptr_t)fn;
    B->h = (void *)(uintptr_t)h;
    Py_INCREF(fallback); Py_XSETREF(B->fallback, fallback);
    Py_INCREF(keep); Py_XSETREF(B->keep, keep);
    Py_INCREF(only); Py_XSETREF(B->only, only);
    B->vectorcall = bound_call;
    return 0;
}

static int bound_traverse(PyObject *self, visitproc visit, void *arg) {
    Bound *B = (Bound *)self;
    Py_VISIT(B->fallback); Py_VISIT(B->keep); Py_VISIT(B->only);
    return 0;
}

static int bound_clear(PyObject *self) {
    Bound *B = (Bound *)self;
    Py_CLEAR(B->fallback); Py_CLEAR(B->keep); Py_CLEAR(B->only);
    return 0;
}

static void bound_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    bound_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject BoundType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_pf_fastcall.Bound",
    .tp_basicsize = sizeof(Bound),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Bound(fn, handle, in_shape, out_shape, fallback, keep, only): f(x, *, out=None) -> out",
    .tp_vectorcall_offset = offsetof(Bound, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_methods = bound_methods,
    .tp_new = PyType_GenericNew,
    .tp_init = bound_init,
    .tp_traverse = bound_traverse,
    .tp_clear = bound_clear,
    .tp_dealloc = bound_dealloc,
};

static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_pf_fastcall", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__pf_fastcall(void) {
    import_array();
    if (PyType_Ready(&BoundType) < 0) return NULL;
    PyObject *m = PyModule_Create(&mod);
    if (!m) return NULL;
    Py_INCREF(&BoundType);
    if (PyModule_AddObject(m, "Bound", (PyObject *)&BoundType) < 0) { Py_DECREF(&BoundType); Py_DECREF(m); return NULL; }
    return m;
}
"""

_CHAIN = r"""
#include <string.h>
typedef void (*step_fn)(void *);
typedef struct { long n; step_fn *fn; void **arg; float *in; long nin; const float *out; long nout; } pf_chain;

void pf_chain_run(void *h, const float *in, float *out) {
    pf_chain *c = (pf_chain *)h;
    memcpy(c->in, in, (size_t)c->nin * sizeof(float));
    for (long i = 0; i < c->n; i++) c->fn[i](c->arg[i]);
    memcpy(out, c->out, (size_t)c->nout * sizeof(float));
}
"""


class _Chain(ctypes.Structure):
    _fields_ = [("n", ctypes.c_long), ("fn", ctypes.c_void_p), ("arg", ctypes.c_void_p), ("inp", ctypes.c_void_p),
                ("nin", ctypes.c_long), ("out", ctypes.c_void_p), ("nout", ctypes.c_long)]


def chain(natives: list[tuple[int, int]], in_view: np.ndarray, out_view: np.ndarray, keep) -> tuple[int, int, object]:
    """One native entry ``run(handle, in, out)`` for steps ``natives`` (each ``(address of f, argument)``, run
    as ``f(argument)`` in order) reading ``in_view`` and writing ``out_view`` (C-contiguous fp32 arrays the
    steps are bound to): ``(entry address, handle, owner)``, the owner keeping the runner, its tables and
    ``keep`` (the steps and their buffers) alive. ``BuildError`` when the runner does not compile here."""
    from .build import build

    lib = ctypes.CDLL(str(build(_CHAIN).path))
    fns = (ctypes.c_void_p * len(natives))(*[f for f, _ in natives])
    args = (ctypes.c_void_p * len(natives))(*[a for _, a in natives])
    c = _Chain(len(natives), ctypes.addressof(fns), ctypes.addressof(args), in_view.ctypes.data, in_view.size,
               out_view.ctypes.data, out_view.size)
    owner = (lib, fns, args, c, in_view, out_view, keep)
    return ctypes.cast(lib.pf_chain_run, ctypes.c_void_p).value, ctypes.addressof(c), owner


def runs(steps: list[Callable[[], None]]) -> list[Callable[[], None]]:
    """``steps`` with every run of two or more native steps (``step.native``) made one call of a ``chain``
    runner with nothing to copy in or out: one ctypes call where there were as many as the run has steps (a
    MobileNetV2 chain of 56 steps runs as 5 calls). The steps themselves, unchanged, where the runner does not
    build here."""
    out: list[Callable[[], None]] = []
    pad = np.zeros(16, np.float32)[:0]  # no input or output to copy: an address for the zero-length copies
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    i = 0
    while i < len(steps):
        j = i
        while j < len(steps) and getattr(steps[j], "native", None) is not None:
            j += 1
        if j - i < 2:
            out.append(steps[i])
            i += 1
            continue
        try:
            fn, handle, owner = chain([f.native for f in steps[i:j]], pad, pad, steps[i:j])
        except Exception:  # noqa: BLE001 - no compiler for the runner here: one call per step stays
            return list(steps)

        def run(entry=proto(fn), handle=handle, ptr=pad.ctypes.data, owner=owner):
            entry(handle, ptr, ptr)
        out.append(run)
        i = j
    return out


_lock = threading.Lock()
_state: dict[str, Any] = {}


def _module():
    """The built extension module, or None (``_state["why"]`` says why)."""
    with _lock:
        if "mod" in _state:
            return _state["mod"]
        mod, why = None, None
        inc = sysconfig.get_paths().get("include")
        if not inc or not (Path(inc) / "Python.h").is_file():
            why = f"no Python headers (Python.h) in {inc}"
        else:
            from .build import BuildError, CompilerMissing, IsaError, build

            try:
                built = build(_SOURCE, extra_flags=(f"-I{inc}", f"-I{np.get_include()}"))
                loader = importlib.machinery.ExtensionFileLoader("_pf_fastcall", str(built.path))
                spec = importlib.util.spec_from_file_location("_pf_fastcall", str(built.path), loader=loader)
                mod = importlib.util.module_from_spec(spec)
                loader.exec_module(mod)
            except (BuildError, CompilerMissing, IsaError, ImportError, OSError) as e:
                why, mod = f"the fast-call extension does not build or load here: {e}", None
        _state["mod"], _state["why"] = mod, why
        return mod


def unavailable() -> str | None:
    """Why the extension cannot be used here (None: it can)."""
    _module()
    return _state.get("why")


def bound(fn_addr: int, handle: int, in_shape: tuple[int, ...], out_shape: tuple[int, ...], fallback: Callable,
          keep: Any) -> Callable | None:
    """``f(x, *, out=None)``: ``fn_addr``'s ``run(handle, x, out)`` on ``x`` and ``out`` (default: a fresh array) when
    they are numpy arrays (exactly ``np.ndarray``), C-contiguous fp32 of shapes ``in_shape`` and ``out_shape``,
    that do not overlap, else
    ``fallback`` called with the same arguments.
    ``keep`` is held as long as the callable (what owns ``handle``). None when the extension is unavailable."""
    mod = _module()
    if mod is None:
        return None
    return mod.Bound(int(fn_addr), int(handle), tuple(int(d) for d in in_shape), tuple(int(d) for d in out_shape),
                     fallback, keep, np.ndarray)


__all__ = ["bound", "chain", "unavailable"]
