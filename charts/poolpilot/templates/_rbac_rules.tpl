{{/* Namespaced permissions of the operator: what it reads, the children it applies. */}}
{{- define "poolpilot.operatorRules" -}}
- apiGroups: [poolpilot.dev]
  resources: [inferencepools]
  verbs: [get, list, watch, patch, update]
- apiGroups: [poolpilot.dev]
  resources: [inferencepools/status]
  verbs: [get, patch, update]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors, podmonitors]
  verbs: [get, list, watch, create, update, patch, delete]
# Pod phases and reasons feed the pool's conditions (PodsPending, Unschedulable, ...).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# Each pool's router gets a ServiceAccount and a Role to watch its engines' EndpointSlices.
# RBAC lets the operator grant only what it holds itself, hence the endpointslices read.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
{{- end -}}

{{/* Cluster-scoped reads the operator needs whatever it watches. */}}
{{- define "poolpilot.operatorClusterRules" -}}
# Whether the monitoring.coreos.com CRDs exist (ServiceMonitor/PodMonitor or annotations), and
# Kopf's observation of its resources.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- end -}}

{{/* Kopf peering: (dict "namespaced" bool). */}}
{{- define "poolpilot.operatorPeeringRules" -}}
{{- if .namespaced }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- else }}
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
# Kopf follows namespaces appearing and going when it serves all of them.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- end }}
{{- end -}}

{{/* Namespaced permissions of the autoscaler: read pools and pods, resize, report. */}}
{{- define "poolpilot.autoscalerRules" -}}
- apiGroups: [poolpilot.dev]
  resources: [inferencepools]
  verbs: [get, list, watch]
- apiGroups: [poolpilot.dev]
  resources: [inferencepools/status]
  verbs: [get, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch, update]
# Ready, Pending and Unschedulable pods count as capacity on the way or ScalingLimited.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* The autoscaler's leader election: (dict "lease" name). The library reads, creates and
replaces one Lease; create cannot be limited to a name. */}}
{{- define "poolpilot.autoscalerLeaderRules" -}}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ .lease | quote }}]
  verbs: [get, update]
{{- end -}}
