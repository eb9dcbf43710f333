/*
 * kp_demangle: kernel names as torch.profiler shows them. CUPTI reports a kernel's name as
 * the compiler emitted it, Itanium-mangled for C++ kernels ("_ZN2at6native..."); Kineto
 * demangles it with the C++ runtime's abi::__cxa_demangle before writing its trace, so kprof
 * does the same, in the agent (never inside the training job), once per distinct name.
 */
#ifndef KP_DEMANGLE_H
#define KP_DEMANGLE_H

#include <stddef.h>

/*
 * The demangled form of name[0..len) when it is a mangled C++ name ("_Z...") that the C++
 * runtime can demangle: a malloc'd NUL-terminated string (the caller frees it) and its length
 * in *out_len. NULL for any other name (a C kernel such as "volta_sgemm_128x64_nn", a name
 * the runtime rejects, or no memory): the caller keeps the name as it is, as Kineto does.
 */
char *kp_demangle(const char *name, size_t len, size_t *out_len);

#endif
