"""C building blocks shared by the CPU templates: SIMD types, exp/GELU, epilogues.

The GEMM epilogue codes (``EPI``) and their C come from the op registry: one
code per name of ``planforge.ops.kernel.gemm_epilogues()``, each applying
its op's ``Epilogue`` snippet, so a new activation op needs no edit here.

Vectors are GCC vector extensions of ``V`` floats: with ``-march=native`` the
compiler lowers them to AVX2/AVX-512 (or SSE/NEON), contracting ``a*b+c`` into
FMA instructions; ``V == 1`` is the plain scalar fallback for any ISA.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Any, Callable

from ....ops import REGISTRY
from ....ops.kernel import gemm_epilogues


def epi_code(epilogue: str) -> int:
    """The C code of a GEMM epilogue name (``none`` 0, ``bias`` 1, ``bias_<op>`` 2...)."""
    names = gemm_epilogues()
    if epilogue not in names:
        raise ValueError(f"unknown epilogue {epilogue!r}; choose one of {', '.join(names)}")
    return names.index(epilogue)


_HEADER = r"""
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef V
#define V 8
#endif

static inline float s_exp(float x) { return expf(x); }
static inline float s_gelu(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

#if V > 1
typedef float vf __attribute__((vector_size(V * 4)));
typedef int32_t vi __attribute__((vector_size(V * 4)));
static inline vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }
/* x - 0 is x for every x (-0.0 included), so it folds to a broadcast; 0 + x does not (it turns -0.0 into +0.0),
   and cost an add and a shuffle on an FMA port in every inner loop that broadcasts a loaded value */
static inline vf vset(float x) { return x - (vf){0}; }
static inline vf vsel(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
/* a > b ? a : b (b where either is NaN), as the x86 max/min instructions compute it: one instruction where the
   width has one, not a compare and two logic ops (six for exp's clamp to its range, in every exp and GELU). GCC's
   builtins, not <immintrin.h>, whose parsing added 0.1 s to every template's build (a fifth of a GEMM's) */
#if defined(__GNUC__) && !defined(__clang__) && V == 16 && defined(__AVX512F__)
static inline vf vmaxf(vf a, vf b) { return __builtin_ia32_maxps512_mask(a, b, a, (unsigned short)-1, 4); }
static inline vf vminf(vf a, vf b) { return __builtin_ia32_minps512_mask(a, b, a, (unsigned short)-1, 4); }
#elif defined(__GNUC__) && !defined(__clang__) && V == 8 && defined(__AVX__)
static inline vf vmaxf(vf a, vf b) { return __builtin_ia32_maxps256(a, b); }
static inline vf vminf(vf a, vf b) { return __builtin_ia32_minps256(a, b); }
#elif defined(__GNUC__) && !defined(__clang__) && V == 4 && defined(__SSE__)
static inline vf vmaxf(vf a, vf b) { return __builtin_ia32_maxps(a, b); }
static inline vf vminf(vf a, vf b) { return __builtin_ia32_minps(a, b); }
#else
static inline vf vmaxf(vf a, vf b) { return vsel(a > b, a, b); }
static inline vf vminf(vf a, vf b) { return vsel(a < b, a, b); }
#endif
static inline float vsum(vf v) { float s = 0; for (int i = 0; i < V; i++) s += v[i]; return s; }
static inline float vmaxr(vf v) { float s = v[0]; for (int i = 1; i < V; i++) s = v[i] > s ? v[i] : s; return s; }
/* exp with Cephes' range reduction and polynomial: relative error ~2e-7 on [-87, 88] */
static inline vf vexp(vf x) {
    x = vminf(vmaxf(x, vset(-87.3f)), vset(88.3f));
    vf t = x * 1.44269504088896341f + 128.5f;           /* > 0, so truncation is floor */
    vi n = __builtin_convertvector(t, vi) - 128;
    vf nf = __builtin_convertvector(n, vf);
    vf r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vf y = p * r * r + r + 1.0f;
    vi e = (n + 127) << 23;
    return y * (vf)e;
}
static inline vf vgelu(vf x) {
    vf u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + vexp(-2.0f * u));
}
#else
typedef float vf;
static inline vf vload(const float *p) { return *p; }
static inline void vstore(float *p, vf v) { *p = v; }
static inline vf vset(float x) { return x; }
static inline vf vmaxf(vf a, vf b) { return a > b ? a : b; }
static inline vf vexp(vf x) { return expf(x); }
static inline vf vgelu(vf x) { return s_gelu(x); }
static inline float vsum(vf v) { return v; }
static inline float vmaxr(vf v) { return v; }
#endif

/* scratch that lives as long as the thread: packing buffers are reused across calls */
static inline float *scratch(float **buf, size_t *cap, size_t n) {
    if (*cap < n) {
        free(*buf);
        *buf = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
        *cap = *buf ? n : 0;
    }
    return *buf;
}
"""


def _epilogue_c() -> str:
    """``s_epi`` and ``vepi``: bias then the activation of each ``bias_<op>`` code, from the ops' snippets."""
    sc, vc = [], []
    for code, name in enumerate(gemm_epilogues()):
        if not name.startswith("bias_"):
            continue
        ep = REGISTRY[name[len("bias_"):]].epilogue
        sc.append(f"    case {code}: {{ float v = x; {ep.scalar} x = v; }} break;")
        vc.append(f"    case {code}: {{ vf v = x; {ep.vec} x = v; }} break;")
    s_epi = ("static inline float s_epi(float x, float b, int epi) {\n    if (epi >= 1) x += b;\n"
             "    switch (epi) {\n" + "\n".join(sc) + "\n    default: break;\n    }\n    return x;\n}\n")
    v_epi = ("static inline vf vepi(vf x, vf b, int epi) {\n    if (epi >= 1) x += b;\n"
             "    switch (epi) {\n" + "\n".join(vc) + "\n    default: break;\n    }\n    return x;\n}\n")
    return s_epi + v_epi


@lru_cache(maxsize=1)
def header() -> str:
    """The C prelude every template includes: vector types, exp/GELU, scratch, and the generated epilogues."""
    return _HEADER + "\n" + _epilogue_c()


def struct_call(fn, args: ctypes.Structure, keep: Any = ()) -> Callable[[], None]:
    """``fn(&args)`` as a no-argument call; ``keep`` holds the arrays the struct points into alive as long as it.
    ``run.native``: ``(address of fn, &args)``, for a caller in C."""
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    ptr = ctypes.addressof(args)
    keep = (keep, args)

    def run(fn=fn, ptr=ptr, keep=keep):
        fn(ptr)

    run.native = (ctypes.cast(fn, ctypes.c_void_p).value, ptr)  # fn(ptr) from C: a lean chain calls it directly
    return run
