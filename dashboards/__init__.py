"""Generators of the Helm chart's Grafana dashboards and Prometheus rules.

The JSON and YAML under charts/poolpilot/files/ are generated from this package
(`poolpilot dashboards --write`) and a test fails when they drift, like the CRD. Every query
names its metrics through poolpilot.metrics and aggregates `by (namespace, pool, role)`, the
labels Prometheus relabels from the pods' poolpilot.dev/pool and poolpilot.dev/role labels.
"""
