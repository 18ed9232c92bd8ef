#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#endif
#include "internal/pycore_code.h"
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#endif
#define P(name, expr) printf("%-28s %zu\n", name, (size_t)(expr))
int main(void) {
  printf("version %s\n", PY_VERSION);
  P("runtime.interpreters.head", offsetof(_PyRuntimeState, interpreters.head));
  #if PY_VERSION_HEX >= 0x030B0000
  P("interp.threads.head", offsetof(PyInterpreterState, threads.head));
#else
  P("interp.threads.head", offsetof(PyInterpreterState, tstate_head));
#endif
  P("tstate.next", offsetof(PyThreadState, next));
  P("tstate.thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030D0000
  P("tstate.current_frame", offsetof(PyThreadState, current_frame));
  P("frame.code(f_executable)", offsetof(_PyInterpreterFrame, f_executable));
  P("frame.previous", offsetof(_PyInterpreterFrame, previous));
  P("frame.instr(instr_ptr)", offsetof(_PyInterpreterFrame, instr_ptr));
  P("frame.owner", offsetof(_PyInterpreterFrame, owner));
#elif PY_VERSION_HEX >= 0x030B0000
  P("tstate.cframe", offsetof(PyThreadState, cframe));
  P("cframe.current_frame", offsetof(_PyCFrame, current_frame));
  P("frame.code(f_code)", offsetof(_PyInterpreterFrame, f_code));
  P("frame.previous", offsetof(_PyInterpreterFrame, previous));
  P("frame.instr(prev_instr)", offsetof(_PyInterpreterFrame, prev_instr));
  P("frame.owner", offsetof(_PyInterpreterFrame, owner));
#else
  P("tstate.frame", offsetof(PyThreadState, frame));
  P("frame.code(f_code)", offsetof(PyFrameObject, f_code));
  P("frame.previous(f_back)", offsetof(PyFrameObject, f_back));
  P("frame.instr(f_lasti)", offsetof(PyFrameObject, f_lasti));
#endif
  P("code.filename", offsetof(PyCodeObject, co_filename));
  P("code.name", offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX >= 0x030B0000
  P("code.qualname", offsetof(PyCodeObject, co_qualname));
  P("code.code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#endif
  P("code.firstlineno", offsetof(PyCodeObject, co_firstlineno));
  P("code.linetable", offsetof(PyCodeObject, co_linetable));
  P("sizeof PyASCIIObject", sizeof(PyASCIIObject));
  P("sizeof PyCompactUnicodeObject", sizeof(PyCompactUnicodeObject));
  P("bytes.ob_sval", offsetof(PyBytesObject, ob_sval));
  P("var.ob_size", offsetof(PyVarObject, ob_size));
  return 0;
}
