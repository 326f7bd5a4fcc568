{{/* Chart name (upstream default: aws-node). */}}
{{- define "aws-vpc-cni.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name; aws-node unless overridden. */}}
{{- define "aws-vpc-cni.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- include "aws-vpc-cni.name" . -}}
{{- end -}}
{{- end -}}

{{- define "aws-vpc-cni.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "aws-vpc-cni.labels" -}}
app.kubernetes.io/name: {{ include "aws-vpc-cni.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
k8s-app: aws-node
helm.sh/chart: {{ include "aws-vpc-cni.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels; `originalMatchLabels` adopts the DaemonSet EKS installs. */}}
{{- define "aws-vpc-cni.selectorLabels" -}}
{{- if .Values.originalMatchLabels -}}
k8s-app: aws-node
{{- else -}}
app.kubernetes.io/name: {{ include "aws-vpc-cni.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- end -}}

{{- define "aws-vpc-cni.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "aws-vpc-cni.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "aws-vpc-cni.image" -}}
{{- printf "%s:%s" .repository (default $.root.Chart.AppVersion .tag) -}}
{{- end -}}
