"""kqv_lab: the applications built on kqv, beside the library in the same distribution: the lecture's experiments
(`kqv_lab.experiments`, `kqv experiment`), the invented worlds (`kqv_lab.worlds`, `kqv world`) and what only they use
(`kqv_lab.measuring`), and the benchmarks' one harness (`kqv_lab.benchmarking`).

It imports kqv only through its public API (`kqv`, `kqv.api`, `kqv.errors`, `kqv.flag_names`, and the names the
packages `kqv.nn`, `kqv.data`, `kqv.train`, `kqv.interop`, `kqv.jobs`, `kqv.cli` and `kqv.explore` export;
tests/test_public_api.py checks it, and the benchmarks, by one definition), and kqv never imports it: its commands
join `kqv` through the entry-point group "kqv.commands".
"""
