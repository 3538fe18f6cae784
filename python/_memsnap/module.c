/* module.c -- the _memsnap extension module (to be written). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef memsnap_module = {
    PyModuleDef_HEAD_INIT, "_memsnap", NULL, 0, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__memsnap(void) { return PyModuleDef_Init(&memsnap_module); }
