"""The poolpilot operator: InferencePool -> Deployments, Services, PDBs, monitors; status.

Pure parts (builders, status, diff) import no Kubernetes client; the Kopf handlers and the
API adapter are thin layers over them.
"""
