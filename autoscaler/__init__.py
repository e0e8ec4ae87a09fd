"""The autoscaler: Prometheus -> pure decision per pool and role -> scale + status.

`decide` (pure core), `queries`/`observe` (Prometheus), `kube` (Kubernetes), `loop`, `main`.
"""
