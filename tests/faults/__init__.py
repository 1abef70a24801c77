"""Fault injection on a replicated local cluster: client hosts as network namespaces, a producer
that records every acknowledged job, and the counts (acknowledged, processed once, processed
twice or more, lost) that ``docs/reliability.md`` reports."""
