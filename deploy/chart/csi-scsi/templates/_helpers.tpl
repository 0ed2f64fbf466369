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
then @digest when the values pin one (the sidecars do). */}}
{{- define "csi-scsi.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{ $image.repository }}:{{ $image.tag | default $root.Chart.AppVersion }}{{ with $image.digest }}@{{ . }}{{ end }}
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
