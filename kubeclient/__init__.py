"""The one Kubernetes API client of poolpilot's components (kubernetes_asyncio underneath).

The operator, the autoscaler, the router's discovery and the sandbox's controller all talk to
the API through `KubeClient`, so they share:

- one credential order (`credentials.resolve`): an explicit --kubeconfig, else in-cluster when
  running in a pod, else $KUBECONFIG, else ~/.kube/config;
- a timeout on every request (watches get their own, longer one);
- one error type, `ApiError`, that says whether a failure is transient (retry as is) or
  permanent (403, 422, quota: a person must act);
- kinds resolved through the API server's discovery (kubernetes_asyncio's dynamic client),
  not a table of plurals.

It is a room of its own, not part of the core: the core (`poolpilot/`) imports no Kubernetes
library, which import-linter enforces, and no room but this one imports kubernetes_asyncio.
"""

from poolpilot.kubeclient.client import KubeClient, Obj
from poolpilot.kubeclient.credentials import NoCredentials, Source, resolve
from poolpilot.kubeclient.errors import ApiError

__all__ = ["ApiError", "KubeClient", "NoCredentials", "Obj", "Source", "resolve"]
