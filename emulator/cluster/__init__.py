"""The emulator's cluster half: what kube-controller-manager and the kubelet do in a real cluster,
for the objects poolpilot makes, so a pool applied to the emulator runs (the sandbox starts it
beside the emulator).

- controller.py: one pass every period runs the jobs below;
- deployments.py: Deployments -> Pods (ReplicaSet logic) and Deployment status;
- leaderworkersets.py: LeaderWorkerSets -> groups of Pods and their status;
- kubelet.py: Pods -> local processes (processes.py) on their own loopback addresses,
  readiness, restarts, graceful deletion;
- endpoints.py: EndpointSlices for every Service with a selector;
- scrape.py: Prometheus scrape targets from the pods' prometheus.io annotations;
- timeline.py: desired and ready replicas per role over time (the sandbox's report reads it);
- pods.py: the pure part (pod specs, the engine command a pod runs, replica plans);
- kubeapi.py, status_cache.py: the API calls they make and the status writes they skip.
"""
