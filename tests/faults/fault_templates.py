"""A GEMV template whose ``mode`` knob plants one fault per candidate, for the fault-injection suite.

``slow`` sleeps on its first call in a worker process (so a kill lands mid-measurement);
``sleepy`` sleeps 20 ms on every call (correct, and certainly not the fastest);
``oom`` allocates and touches memory until an allocation fails (the worker's
RLIMIT_AS bounds it; without a limit it stops at 6 GiB and succeeds, which the
suite would report as a fault not injected).
"""
import faulty_templates
from planforge.targets.cpu.templates import Template
from planforge.targets.cpu.templates.common import header
from planforge.targets.cpu.templates.gemv import bind as gemv_bind
from planforge.space import Space, categorical

BODY = {
    **{k: faulty_templates.BODY[k] for k in ("ok", "crash", "hang", "wrong", "badsyntax")},
    "ok2": "y[j] = s + 0.0f;",
    "slow": "y[j] = s;",
    "sleepy": "y[j] = s;",
    "oom": "y[j] = s;",
}
PROLOGUE = {
    "slow": "static int slept = 0; if (!slept) { slept = 1; usleep(1500000); }",
    "sleepy": "usleep(20000);",
    "oom": "size_t total = 0; while (total < ((size_t)6 << 30)) { char *p = malloc(64 << 20); "
           "if (!p) { volatile int *q = (int *)0; *q = 1; } memset(p, 1, 64 << 20); total += 64 << 20; }",
}


def source(p, knobs):
    m = knobs["mode"]
    return header() + f"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef struct {{ const float *x, *W, *bias; float *y; int N, K, threads; }} gemv_args;
void pf_gemv(const gemv_args *g) {{
    const float *x = g->x, *W = g->W; float *y = g->y; int N = g->N, K = g->K;
    {PROLOGUE.get(m, "")}
    for (int j = 0; j < N; j++) {{
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += x[k] * W[(long)k * N + j];
        {BODY[m]}
    }}
}}
"""


def template(modes):
    return Template(
        "faults",
        space=lambda p, lim: Space([categorical("mode", tuple(modes)), categorical("threads", (1,))]),
        source=source,
        bind=lambda lib, p, k, i, out: gemv_bind(lib, {**k, "w_layout": "row"}, i["x"], i["W"], None, out),
        registry="faults.fault_templates",
    )


TEMPLATES = {"faults": template(BODY)}
