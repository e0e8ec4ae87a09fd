{{/* Object name prefix: <release>-poolpilot, or the release name when it already says poolpilot. */}}
{{- define "poolpilot.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The labels the chart sets on its objects; users' labels never replace these. */}}
{{- define "poolpilot.chartLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: poolpilot
{{- end -}}

{{/* Keys of the chart's labels (and the component label the templates add). */}}
{{- define "poolpilot.reservedLabelKeys" -}}
{{- list "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "app.kubernetes.io/part-of" "app.kubernetes.io/component" | toJson -}}
{{- end -}}

{{/* Metadata labels of an object without a component: the chart's, then commonLabels. */}}
{{- define "poolpilot.labels" -}}
{{ include "poolpilot.chartLabels" . }}
{{- $common := omit (.Values.commonLabels | default dict) "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "app.kubernetes.io/part-of" "app.kubernetes.io/component" }}
{{- with $common }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Metadata labels of a component's object: (dict "ctx" $ "component" "operator" ["extra" map]).
The chart's labels and the component, then commonLabels, then extra (monitors' own labels)
over commonLabels. */}}
{{- define "poolpilot.componentLabels" -}}
{{ include "poolpilot.chartLabels" .ctx }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- $reserved := include "poolpilot.reservedLabelKeys" . | fromJsonArray }}
{{- $users := merge (deepCopy (.extra | default dict)) (.ctx.Values.commonLabels | default dict) }}
{{- range $reserved }}{{ $_ := unset $users . }}{{ end }}
{{- with $users }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "operator") */}}
{{- define "poolpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ default .ctx.Chart.Name .ctx.Values.nameOverride }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The namespace of every namespaced object: namespaceOverride, else the release's. */}}
{{- define "poolpilot.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace -}}
{{- end -}}

{{/* repository:tag, or repository@digest when image.digest is set. global.imageRegistry
(an umbrella chart's mirror) replaces the repository's registry, or prefixes it when it names
none (a first path component with a dot or a colon, or localhost, is a registry). */}}
{{- define "poolpilot.image" -}}
{{- $repo := .Values.image.repository -}}
{{- $registry := dig "imageRegistry" "" (.Values.global | default dict) -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repo = join "/" (rest $parts) -}}
{{- end -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{ $repo }}@{{ .Values.image.digest }}
{{- else -}}
{{ $repo }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets, then global.imagePullSecrets (an umbrella chart's: {name: ...} objects
or plain names), without repeats. */}}
{{- define "poolpilot.imagePullSecrets" -}}
{{- $secrets := .Values.imagePullSecrets | default list -}}
{{- range dig "imagePullSecrets" list (.Values.global | default dict) -}}
{{- $secrets = append $secrets (kindIs "string" . | ternary (dict "name" .) .) -}}
{{- end -}}
{{- $secrets = uniq $secrets -}}
{{- with $secrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A component's replicas: replicaCount when set, else replicas (the older key):
(dict "ctx" $ "component" "operator"). */}}
{{- define "poolpilot.replicas" -}}
{{- $values := index .ctx.Values .component -}}
{{- if kindIs "invalid" $values.replicaCount -}}
{{- $values.replicas -}}
{{- else -}}
{{- $values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* Labels of a monitor or rule: its additionalLabels over monitoring.labels:
(dict "ctx" $ "additional" map). */}}
{{- define "poolpilot.monitoringLabels" -}}
{{- merge (deepCopy (.additional | default dict)) (.ctx.Values.monitoring.labels | default dict) | toJson -}}
{{- end -}}

{{/* A securityContext: the chart-wide one with the component's merged over it, key by key
(nested maps too); a key the component sets to null is left out (e.g. runAsUser on
OpenShift): (dict "ctx" $ "component" "operator" "key" "podSecurityContext"); without a
component, the chart-wide one. */}}
{{- define "poolpilot.securityContext" -}}
{{- $sc := deepCopy (index .ctx.Values .key | default dict) -}}
{{- if .component -}}
{{- $own := index (index .ctx.Values .component) .key | default dict -}}
{{- $sc = mergeOverwrite $sc (deepCopy $own) -}}
{{- range $k, $v := $own -}}
{{- if kindIs "invalid" $v }}{{ $_ := unset $sc $k }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toYaml $sc }}
{{- end -}}

{{/* Pod securityContext: (dict "ctx" $ ["component" "operator"]). Restricted by default. */}}
{{- define "poolpilot.podSecurityContext" -}}
{{- include "poolpilot.securityContext" (merge (dict "key" "podSecurityContext") .) }}
{{- end -}}

{{/* Container securityContext: (dict "ctx" $ ["component" "operator"]). */}}
{{- define "poolpilot.containerSecurityContext" -}}
{{- include "poolpilot.securityContext" (merge (dict "key" "securityContext") .) }}
{{- end -}}

{{/* A component's topologySpreadConstraints; a constraint without a labelSelector gets the
component's selector labels (the usual intent: spread these pods):
(dict "ctx" $ "component" "operator" "selector" map). */}}
{{- define "poolpilot.topologySpreadConstraints" -}}
{{- $out := list -}}
{{- range (index .ctx.Values .component).topologySpreadConstraints -}}
{{- $c := deepCopy . -}}
{{- if not (hasKey $c "labelSelector") -}}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $.selector) -}}
{{- end -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- with $out }}
topologySpreadConstraints:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Refuses a component's extraEnv, extraVolumes and extraVolumeMounts that would replace
what the chart sets: (dict "ctx" $ "component" "operator" "env" list "volumes" list
"mountPaths" list). */}}
{{- define "poolpilot.checkExtras" -}}
{{- $values := index .ctx.Values .component -}}
{{- $component := .component -}}
{{- range $values.extraEnv -}}
{{- if has .name $.env -}}
{{- fail (printf "%s.extraEnv: %s is set by the chart (%s)" $component .name (join ", " $.env)) -}}
{{- end -}}
{{- end -}}
{{- range $values.extraVolumes -}}
{{- if has .name $.volumes -}}
{{- fail (printf "%s.extraVolumes: the volume name %s is the chart's (%s)" $component .name (join ", " $.volumes)) -}}
{{- end -}}
{{- end -}}
{{- range $values.extraVolumeMounts -}}
{{- if has .mountPath $.mountPaths -}}
{{- fail (printf "%s.extraVolumeMounts: %s is mounted by the chart already (%s)" $component .mountPath (join ", " $.mountPaths)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's PodDisruptionBudget spec keys, or nothing when it gets none: maxUnavailable
when set (it replaces minAvailable), else minAvailable. With one replica and no
maxUnavailable there is none: minAvailable 1 of 1 would block every node drain.
(dict "ctx" $ "component" "operator"). */}}
{{- define "poolpilot.pdbSpec" -}}
{{- /* A release upgraded with --reuse-values from a chart without this key keeps its budget. */ -}}
{{- $pdb := (index .ctx.Values .component).podDisruptionBudget | default (dict "enabled" true "minAvailable" 1) -}}
{{- $replicas := int (include "poolpilot.replicas" .) -}}
{{- if $pdb.enabled -}}
{{- if not (kindIs "invalid" $pdb.maxUnavailable) -}}
maxUnavailable: {{ $pdb.maxUnavailable | toYaml }}
{{- else if kindIs "invalid" $pdb.minAvailable -}}
{{- fail (printf "%s.podDisruptionBudget: set minAvailable or maxUnavailable (or enabled: false)" .component) -}}
{{- else if gt $replicas 1 -}}
minAvailable: {{ $pdb.minAvailable | toYaml }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount of a component: (dict "ctx" $ "component" "operator"). */}}
{{- define "poolpilot.serviceAccountName" -}}
{{- if .ctx.Values.serviceAccount.name -}}
{{- .ctx.Values.serviceAccount.name -}}
{{- else -}}
{{- printf "%s-%s" (include "poolpilot.fullname" .ctx) .component -}}
{{- end -}}
{{- end -}}

{{/* A component's pod labels: the chart's (which cannot be overridden), the component's
podLabels, then podLabels, then commonLabels. */}}
{{- define "poolpilot.podLabels" -}}
{{- $values := index .ctx.Values .component -}}
{{- $own := include "poolpilot.chartLabels" .ctx | fromYaml -}}
{{- $_ := set $own "app.kubernetes.io/component" .component -}}
{{- toYaml (merge $own $values.podLabels .ctx.Values.podLabels (.ctx.Values.commonLabels | default dict)) }}
{{- end -}}

{{/* A component's pod annotations: its podAnnotations over the chart-wide podAnnotations. */}}
{{- define "poolpilot.podAnnotations" -}}
{{- $values := index .ctx.Values .component -}}
{{- with merge (deepCopy ($values.podAnnotations | default dict)) (.ctx.Values.podAnnotations | default dict) }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{/* --all-namespaces, or one --namespace per watched namespace. */}}
{{- define "poolpilot.namespaceArgs" -}}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace
- {{ . | quote }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- end -}}
