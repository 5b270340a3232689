{{/* The name of a cluster-scoped object: clusterNamePrefix + the base name. */}}
{{- define "coroner.clusterName" -}}
{{ $.root.Values.clusterNamePrefix }}{{ $.name }}
{{- end -}}

{{/*
Labels of every object: kustomize's (deploy/base adds app.kubernetes.io/part-of) and
Helm's own (chart, instance, managed-by), which test/deploy sets aside when it compares.
*/}}
{{- define "coroner.labels" -}}
app.kubernetes.io/part-of: coroner
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "coroner.agentLabels" -}}
app.kubernetes.io/name: coroner-agent
app.kubernetes.io/component: agent
{{- end -}}

{{- define "coroner.shimLabels" -}}
app.kubernetes.io/name: coroner-shim
app.kubernetes.io/component: shim
{{- end -}}

{{- define "coroner.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}
