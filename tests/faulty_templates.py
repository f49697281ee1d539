"""A template whose knob plants a fault: used to prove that faults become outcomes."""
from planforge.targets.cpu.templates import Template
from planforge.targets.cpu.templates.common import header
from planforge.targets.cpu.templates.gemv import bind as gemv_bind
from planforge.space import Space, categorical

MODES = ("ok", "crash", "hang", "wrong", "oob", "badsyntax", "abort")

BODY = {
    "ok": "y[j] = s;",
    "crash": "y[j] = s; if (j == N - 1) { volatile int *p = (int *)16; *p = 1; }",
    "hang": "y[j] = s; if (j == N - 1) { volatile int spin = 1; while (spin) {} }",
    "wrong": "y[j] = s + (j == 3 ? 0.5f : 0.0f);",
    "oob": "y[j] = s; if (j == N - 1) y[N + 7] = 1.0f;",
    "badsyntax": "y[j] = s +;",
    "abort": "y[j] = s; if (j == N - 1) abort();",
}


def source(p, knobs):
    return header() + f"""
typedef struct {{ const float *x, *W, *bias; float *y; int N, K, threads; }} gemv_args;
void pf_gemv(const gemv_args *g) {{
    const float *x = g->x, *W = g->W; float *y = g->y; int N = g->N, K = g->K;
    for (int j = 0; j < N; j++) {{
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += x[k] * W[(long)k * N + j];
        {BODY[knobs['mode']]}
    }}
}}
"""


TEMPLATES = {
    "faulty": Template(
        "faulty",
        space=lambda p, lim: Space([categorical("mode", MODES), categorical("threads", (1,))]),
        source=source,
        bind=lambda lib, p, k, i, out: gemv_bind(lib, {**k, "w_layout": "row"}, i["x"], i["W"], None, out),
        registry="faulty_templates",
    )
}
