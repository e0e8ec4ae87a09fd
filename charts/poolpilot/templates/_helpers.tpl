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

{{- define "poolpilot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: poolpilot
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "operator") */}}
{{- define "poolpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ default .ctx.Chart.Name .ctx.Values.nameOverride }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "poolpilot.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "poolpilot.monitoringLabels" -}}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod securityContext: .Values.podSecurityContext (restricted by default; keys set to null
are left out, e.g. runAsUser on OpenShift). */}}
{{- define "poolpilot.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end -}}

{{/* Container securityContext: .Values.securityContext. */}}
{{- define "poolpilot.containerSecurityContext" -}}
{{- toYaml .Values.securityContext }}
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
podLabels, then podLabels. */}}
{{- define "poolpilot.podLabels" -}}
{{- $values := index .ctx.Values .component -}}
{{- $own := include "poolpilot.labels" .ctx | fromYaml -}}
{{- $_ := set $own "app.kubernetes.io/component" .component -}}
{{- toYaml (merge $own $values.podLabels .ctx.Values.podLabels) }}
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
