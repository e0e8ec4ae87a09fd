"""The local sandbox: the whole system on one machine, replaying a real trace.

`poolpilot sandbox` starts the Kubernetes API emulator, a small controller that turns
Deployments into local processes (each pod on its own 127.0.0.N), a real Prometheus, the
operator, the autoscaler and the router, applies a pool with kubectl, replays a trace through
the OpenAI client and writes a report. See docs/sandbox.md.
"""
