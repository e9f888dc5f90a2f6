"""The benchmark workloads of docs/workloads.md (W1-W6), max-pooling (W7) and secure
aggregation (W8), both from issue 6, one training step (W12), the non-linear functions and
the transformer layer of issue 13 (W9-W11, W13), the Hugging Face models of issue 23
(W14-W16) and the pointer per-op overhead (P1, P2).

Each builder (``w1_mul(n)``, ..., ``w7_maxpool(n, parties=3)``) makes fresh workers (2 to 5
computing parties plus a crypto provider) with its ``factory`` (a name -> worker callable:
``pt.VirtualWorker`` by default; ``python -m benchmarks --network`` passes one that connects
to served worker processes), builds and shares its inputs (before any timer, unless the
workload says otherwise) and returns a :class:`Workload`:

* ``run()``: the secure op, what the timer measures. Only W3 (the comparison result is
  revealed as 0/1) and W6 (share + reconstruct) reconstruct anything inside it.
* ``plain()``: the same op in plaintext torch, for the ratio.
* ``check()``: one more secure run, reconstructed and compared with plaintext: max abs error,
  or the number of mismatches for comparisons (exact agreement is expected).

:func:`measure` times a workload (one warm-up, then ``repeat`` runs) and :func:`profile`
records the rest: plaintext time, rounds and bytes of one run under ``mpc.stats()``, the
time spent inside the crypto provider and the correctness check.

The modules: ``workload`` (the :class:`Workload` type and the builders' helpers),
``workers`` (party names, worker factory, the sessions' config: set
``workers.CONFIG``), ``protocol`` (W1-W8, W12), ``functions`` (W9-W11, W13), ``hf``
(W14-W16), ``pointer`` (P1, P2), ``registry`` (ids, cases, sizes, tolerances),
``measuring`` (timing and profiling), ``rss`` (peak memory) and ``tables`` (the printed
tables). This package re-exports what the benchmark, its tests and the docs use.
"""

from benchmarks.workloads import workers
from benchmarks.workloads.functions import (
    SOFTMAX_COLUMNS,
    transformer_layer,
    w9_sigmoid,
    w10_softmax,
    w11_functions,
    w13_transformer,
)
from benchmarks.workloads.generation import w16_decode, w17_decode
from benchmarks.workloads.hf import TINY_BERT, TINY_GPT2, hf_model, w14_bert, w15_gpt2
from benchmarks.workloads.measuring import (
    RESULTS,
    _time_calls,
    finish,
    measure,
    processes_cpu,
    profile,
    time_plain,
    timings,
)
from benchmarks.workloads.pointer import pointer_add, pointer_add_get
from benchmarks.workloads.protocol import (
    lenet,
    pool_shape,
    w1_mul,
    w2_matmul,
    w3_lt,
    w4_relu,
    w5_lenet,
    w6_roundtrip,
    w7_maxpool,
    w8_secagg,
    w12_train,
)
from benchmarks.workloads.registry import (
    EXACT,
    FUNCTION_SIZES,
    MEAN_TOLERANCE,
    MPC_CASES,
    NOT_ELEMENTS,
    OPS,
    POINTER_CASES,
    SIZE_UNIT,
    TOLERANCE,
    WORKLOADS,
    Case,
    failures,
    size_of,
)
from benchmarks.workloads.rss import peak_rss, reset_peak_rss
from benchmarks.workloads.tables import (
    CPU_NOTE,
    DEALER_NOTE,
    ELEMENTS_NOTE,
    NETWORK_CPU_NOTE,
    NETWORK_NOTE,
    POINTER_HEADER,
    _fmt_time,
    format_markdown,
    format_row,
    format_table,
    mpc_header,
)
from benchmarks.workloads.workers import (
    DEALER_NAME,
    PARTY_NAMES,
    SECAGG_CLIENTS,
    WorkerFactory,
    worker_names,
)
from benchmarks.workloads.workload import FRAC_BITS, SEED, Workload, size_label

__all__ = [
    "CPU_NOTE",
    "DEALER_NAME",
    "DEALER_NOTE",
    "ELEMENTS_NOTE",
    "EXACT",
    "FRAC_BITS",
    "FUNCTION_SIZES",
    "MEAN_TOLERANCE",
    "MPC_CASES",
    "NETWORK_CPU_NOTE",
    "NETWORK_NOTE",
    "NOT_ELEMENTS",
    "OPS",
    "PARTY_NAMES",
    "POINTER_CASES",
    "POINTER_HEADER",
    "RESULTS",
    "SECAGG_CLIENTS",
    "SEED",
    "SIZE_UNIT",
    "SOFTMAX_COLUMNS",
    "TINY_BERT",
    "TINY_GPT2",
    "TOLERANCE",
    "WORKLOADS",
    "Case",
    "WorkerFactory",
    "Workload",
    "_fmt_time",
    "_time_calls",
    "failures",
    "finish",
    "format_markdown",
    "format_row",
    "format_table",
    "hf_model",
    "lenet",
    "measure",
    "mpc_header",
    "peak_rss",
    "pointer_add",
    "pointer_add_get",
    "pool_shape",
    "processes_cpu",
    "profile",
    "reset_peak_rss",
    "size_label",
    "size_of",
    "time_plain",
    "timings",
    "transformer_layer",
    "w1_mul",
    "w2_matmul",
    "w3_lt",
    "w4_relu",
    "w5_lenet",
    "w6_roundtrip",
    "w7_maxpool",
    "w8_secagg",
    "w9_sigmoid",
    "w10_softmax",
    "w11_functions",
    "w12_train",
    "w13_transformer",
    "w14_bert",
    "w15_gpt2",
    "w16_decode",
    "w17_decode",
    "worker_names",
    "workers",
]
