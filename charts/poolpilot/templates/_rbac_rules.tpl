{{- /*
Only the verbs the code calls: tests/adapter/test_rbac_least_privilege.py runs the operator and
a router's discovery (test_autoscaler_ha.py the autoscaler) through every path that writes,
maps each request to the verb the API server checks, and fails on a call these rules refuse or
a verb no call used. Server-side apply is a PATCH, and `create` when it makes the object.
*/ -}}

{{/* Namespaced permissions of the operator: the pools, the children it applies. */}}
{{- define "poolpilot.operatorRules" -}}
# Kopf lists and watches the pools and patches them (finalizer, its progress annotations).
- apiGroups: [poolpilot.dev]
  resources: [inferencepools]
  verbs: [get, list, watch, patch]
- apiGroups: [poolpilot.dev]
  resources: [inferencepools/status]
  verbs: [patch]
# Children carry an owner reference with blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift) allows only with this.
- apiGroups: [poolpilot.dev]
  resources: [inferencepools/finalizers]
  verbs: [update]
# Each child: read by name, server-side applied (create or patch), deleted when stale.
- apiGroups: [apps]
  resources: [deployments, daemonsets]
  verbs: [get, create, patch, delete]
# spec.model.cache: the prefetch Job (SharedVolume) and its PVCs, the prefetcher DaemonSet
# (NodeLocal, above).
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts]
  verbs: [get, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors, podmonitors]
  verbs: [get, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
# spec.gateway: the pool's HTTPRoute and, with inferencePool, its GIE InferencePool.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, create, patch, delete]
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, create, patch, delete]
# Multi-node roles (nodesPerReplica > 1): their LeaderWorkerSets, sized once by apply.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch, delete]
# Pod phases and reasons feed the pool's conditions (PodsPending, Unschedulable, ...);
# watch: granted to each router (its discovery follows the pods' draining mark).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# --router-auth (operator.routerAuth): each pool's default router key Secret, created once.
# Create only: the operator never reads, lists or changes a Secret.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
# Each pool's router gets a Role to list and watch its engines' EndpointSlices; RBAC lets the
# operator grant only rights it holds itself.
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
{{- end -}}

{{/* Cluster-scoped reads the operator needs whatever it watches. */}}
{{- define "poolpilot.operatorClusterRules" -}}
# Kopf follows the CustomResourceDefinitions of the resources it serves.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end -}}

{{/* Kopf peering: (dict "namespaced" bool). */}}
{{- define "poolpilot.operatorPeeringRules" -}}
{{- if .namespaced }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [list, watch, patch]
{{- else }}
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [list, watch, patch]
{{- end }}
{{- end -}}

{{/* Namespaced permissions of the autoscaler: read pools and workloads, resize, report. */}}
{{- define "poolpilot.autoscalerRules" -}}
# Its cache lists and watches pools, Deployments and pods; a status write reads the pool.
- apiGroups: [poolpilot.dev]
  resources: [inferencepools]
  verbs: [get, list, watch]
- apiGroups: [poolpilot.dev]
  resources: [inferencepools/status]
  verbs: [patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [list, watch]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [patch]
# Multi-node roles run on LeaderWorkerSets, resized (whole groups) through /scale.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [list, watch]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets/scale]
  verbs: [patch]
# Ready, Pending and Unschedulable pods count as capacity on the way or ScalingLimited;
# before a scale-down the pods that go are annotated (pod-deletion-cost, draining).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* The autoscaler's leader election: (dict "leases" names), one Lease per shard. The
library reads, creates and replaces its Lease; create cannot be limited to a name. */}}
{{- define "poolpilot.autoscalerLeaderRules" -}}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ range $i, $l := .leases }}{{ if $i }}, {{ end }}{{ $l | quote }}{{ end }}]
  verbs: [get, update]
{{- end -}}
