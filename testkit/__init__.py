"""The test kit: what the tests, the end-to-end suites, the perf harnesses and the sandbox use to
start and drive the system, and nothing that ships (no image contains this folder; import-linter
keeps every control-plane module from importing it).

- `polling.wait_for`: poll a condition until it holds.
- `prometheus`: a real Prometheus on loopback (`PrometheusProcess`, file_sd `Target`s) and
  synthetic /metrics pages (`MetricsPage`); `free_port`.
- `cluster.cluster_from_env`: the Kubernetes API emulator, or a real cluster when given a
  kubeconfig.
- `operator`: real kubectl (`Kubectl`), the CRDs `install`ed, the operator in a thread.
- `engine_sim.EngineSimProcess`: `poolpilot engine-sim` as a child process.
- `sandbox.SandboxThread`: a sandbox driven from synchronous code (pytest fixtures).
"""
