{{/* Chart name, honouring nameOverride. */}}
{{- define "cmh.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: fullnameOverride, else release name (+ chart name unless already in it). */}}
{{- define "cmh.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $n := include "cmh.name" . -}}
{{- if contains $n .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $n | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "cmh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "cmh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "cmh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "cmh.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "aws-vpc-cni" -}}
{{- end -}}
{{- end -}}

{{- define "cmh.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.override -}}
{{- .Values.image.override -}}
{{- else if .Values.image.repository -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- else -}}
{{- printf "%s.dkr.ecr.%s.%s/cni-metrics-helper:%s" .Values.image.account .Values.image.region .Values.image.domain $tag -}}
{{- end -}}
{{- end -}}
