{{/*
Labels on every object. app.kubernetes.io/part-of is the one the kustomize
base sets too; the others are Helm's (deploy/parity.py ignores them when it
compares the chart with deploy/overlays/production).
*/}}
{{- define "csi-scsi.labels" -}}
app.kubernetes.io/part-of: csi-scsi
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* An image reference: repository:tag, the tag defaulting to appVersion,
then @digest when the values pin one (the sidecars do). With
global.imageRegistry, the repository's registry host (its first component,
when that has a "." or a ":" or is localhost, as container runtimes read
it) is replaced by it, or the registry is prefixed to a repository that
names none. */}}
{{- define "csi-scsi.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- $repository := $image.repository -}}
{{- with ($root.Values.global).imageRegistry -}}
{{- $parts := splitList "/" $repository -}}
{{- $host := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $host) (contains ":" $host) (eq $host "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository -}}
{{- end -}}
{{ $repository }}:{{ $image.tag | default $root.Chart.AppVersion }}{{ with $image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/* A Pod template's metadata: the selector's labels (name, component),
then the values' podLabels and podAnnotations (the schema keeps podLabels
off the selector's keys). Called with (list name component values). */}}
{{- define "csi-scsi.podMetadata" -}}
{{- $values := index . 2 -}}
metadata:
  labels:
    app.kubernetes.io/name: {{ index . 0 }}
    app.kubernetes.io/component: {{ index . 1 }}
    {{- with $values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* RUST_LOG (the log filter), then the values' extraEnv. */}}
{{- define "csi-scsi.logEnv" -}}
- name: RUST_LOG
  value: {{ .logLevel | quote }}
{{- with .extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The securityContext of every unprivileged container. */}}
{{- define "csi-scsi.restricted" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end }}

{{/* The POD_NAMESPACE variable, from the downward API. */}}
{{- define "csi-scsi.podNamespaceEnv" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}

{{/* The namespace of the CHAP Secrets: controller.chapSecretNamespace, or the release's. */}}
{{- define "csi-scsi.chapSecretNamespace" -}}
{{ .Values.controller.chapSecretNamespace | default .Release.Namespace }}
{{- end }}
