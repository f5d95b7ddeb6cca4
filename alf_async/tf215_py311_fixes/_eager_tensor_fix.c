/* Frees what TF 2.15's EagerTensor deallocator leaks on CPython 3.11.
 *
 * Why: on 3.11 EagerTensor inherits Py_TPFLAGS_MANAGED_DICT from its Python
 * base class, so creating one allocates a small "inline values" array before
 * the object (object_new -> _PyObject_InitializeDict). CPython's own
 * subtype_dealloc frees it; TF's EagerTensor_dealloc calls tp_free directly
 * and never does, so every EagerTensor made from Python leaks 40-48 bytes
 * (tensorflow/tensorflow#62551). In the driver that was ~29 bytes per env
 * step (benchmarks/memory.py), without end: a week-long run grows by gigabytes.
 *
 * What: wraps EagerTensor's tp_dealloc. For instances of exactly that type
 * (subclasses go through subtype_dealloc, which frees the array itself), it
 * does what subtype_dealloc does with a managed dict -- drop the materialized
 * dict if there is one, otherwise decref the inline values and free the array
 * -- and then calls TF's deallocator. Mirrors CPython 3.11's
 * _PyObject_FreeInstanceAttributes / free_values, which are not exported.
 * Built for CPython 3.11 only; alf_async.tf215_py311_fixes.eager_tensor_fix installs it only on
 * the stack it was checked on (see there).
 */
#define PY_SSIZE_T_CLEAN
#ifndef Py_BUILD_CORE_MODULE
#define Py_BUILD_CORE_MODULE 1
#endif
#include <Python.h>
#include "internal/pycore_dict.h"

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030C0000
#error "alf_async.tf215_py311_fixes._eager_tensor_fix is for CPython 3.11 only"
#endif

static destructor tf_dealloc = NULL;
static PyTypeObject *patched = NULL;
static unsigned long long freed = 0;

static void fixed_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    if (tp == patched && (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT)) {
        /* 3.11's pre-header: [values*][dict*][GC head: 2 words][object]. */
        PyObject **dict_ptr = ((PyObject **)self) - 3;
        PyDictValues **values_ptr = ((PyDictValues **)self) - 4;
        /* As subtype_dealloc: out of the GC's sight before any decref can run
         * other code (TF's deallocator untracks again; that is allowed). */
        PyObject_GC_UnTrack(self);
        if (*dict_ptr != NULL) {
            Py_CLEAR(*dict_ptr);
        } else if (*values_ptr != NULL) {
            PyDictValues *values = *values_ptr;
            PyDictKeysObject *keys = ((PyHeapTypeObject *)tp)->ht_cached_keys;
            if (keys != NULL) {
                for (Py_ssize_t i = 0; i < keys->dk_nentries; i++) {
                    Py_XDECREF(values->values[i]);
                }
            }
            *values_ptr = NULL;
            int prefix_size = ((uint8_t *)values)[-1];
            PyMem_Free(((char *)values) - prefix_size);
            freed++;
        }
    }
    tf_dealloc(self);
}

static PyObject *install(PyObject *module, PyObject *type) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "install() needs the EagerTensor type");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)type;
    if (!(tp->tp_flags & Py_TPFLAGS_HEAPTYPE) || !(tp->tp_flags & Py_TPFLAGS_MANAGED_DICT)) {
        Py_RETURN_FALSE;  /* nothing leaks on such a type: leave it alone */
    }
    if (patched == NULL) {
        Py_INCREF(tp);
        patched = tp;
        tf_dealloc = tp->tp_dealloc;
        tp->tp_dealloc = fixed_dealloc;
    } else if (patched != tp) {
        PyErr_SetString(PyExc_RuntimeError, "already installed on another type");
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *freed_count(PyObject *module, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(freed);
}

static PyMethodDef methods[] = {
    {"install", install, METH_O,
     "install(EagerTensor) -> bool: wrap its tp_dealloc (idempotent)."},
    {"freed", freed_count, METH_NOARGS, "inline-values arrays freed so far"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_eager_tensor_fix",
    "Frees the inline-values array TF 2.15's EagerTensor leaks on CPython 3.11.", -1, methods};

PyMODINIT_FUNC PyInit__eager_tensor_fix(void) { return PyModule_Create(&module_def); }
