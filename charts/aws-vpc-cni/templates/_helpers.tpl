{{/* Chart name (default aws-node through nameOverride). */}}
{{- define "aws-vpc-cni.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name: fullnameOverride (aws-node by default), else the release name, suffixed with
the chart name unless the release name already contains it (upstream's rule). */}}
{{- define "aws-vpc-cni.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "aws-vpc-cni.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object: the same keys as upstream's chart, k8s-app: aws-node included. */}}
{{- define "aws-vpc-cni.labels" -}}
app.kubernetes.io/name: {{ include "aws-vpc-cni.name" . }}
helm.sh/chart: {{ include "aws-vpc-cni.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
k8s-app: aws-node
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The DaemonSet selector, exactly upstream's (it is immutable: a different one makes
`helm upgrade` from upstream's release fail): `k8s-app: aws-node` alone with
originalMatchLabels, else name + instance + every podLabels entry. */}}
{{- define "aws-vpc-cni.selectorLabels" -}}
{{- if .Values.originalMatchLabels -}}
k8s-app: aws-node
{{- else -}}
app.kubernetes.io/name: {{ include "aws-vpc-cni.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* Pod labels: always name, instance and k8s-app: aws-node (what kubectl -l k8s-app=aws-node,
the metrics helper and the PodMonitor look for), plus podLabels. */}}
{{- define "aws-vpc-cni.podLabels" -}}
app.kubernetes.io/name: {{ include "aws-vpc-cni.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
k8s-app: aws-node
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "aws-vpc-cni.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "aws-vpc-cni.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The tag of this project's images: image.tag / init.image.tag, else the appVersion. */}}
{{- define "aws-vpc-cni.tag" -}}
{{- default .root.Chart.AppVersion .image.tag -}}
{{- end -}}

{{/* An image reference from upstream's keys: override, else overrideRepository:tag, else
(ours) repository:tag, else upstream's ECR form with `ecrName`.
Called with (dict "image" <image values> "ecrName" <name> "root" $). */}}
{{- define "aws-vpc-cni.imageRef" -}}
{{- $tag := include "aws-vpc-cni.tag" . -}}
{{- if .image.override -}}
{{- .image.override -}}
{{- else if .image.overrideRepository -}}
{{- printf "%s:%s" .image.overrideRepository $tag -}}
{{- else if .image.repository -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- else -}}
{{- printf "%s.dkr.%s.%s.%s/%s:%s" (toString .image.account) .image.endpoint .image.region .image.domain .ecrName $tag -}}
{{- end -}}
{{- end -}}

{{- define "aws-vpc-cni.image" -}}
{{- include "aws-vpc-cni.imageRef" (dict "image" .Values.image "ecrName" "amazon-k8s-cni" "root" .) -}}
{{- end -}}

{{- define "aws-vpc-cni.initImage" -}}
{{- include "aws-vpc-cni.imageRef" (dict "image" .Values.init.image "ecrName" "amazon-k8s-cni-init" "root" .) -}}
{{- end -}}

{{/* The network policy agent's image, upstream's coordinates (no `repository` key: the agent
is upstream's, not ours). */}}
{{- define "aws-vpc-cni.nodeAgentImage" -}}
{{- $i := .Values.nodeAgent.image -}}
{{- if $i.override -}}
{{- $i.override -}}
{{- else if $i.overrideRepository -}}
{{- printf "%s:%s" $i.overrideRepository (toString $i.tag) -}}
{{- else -}}
{{- printf "%s.dkr.%s.%s.%s/amazon/aws-network-policy-agent:%s" (toString $i.account) $i.endpoint $i.region $i.domain (toString $i.tag) -}}
{{- end -}}
{{- end -}}

{{/* A scalar value as text. Numbers are written as integers when they are whole: Helm reads
YAML numbers as floats, and upstream's chart writes e.g. 1048576 as "1.048576e+06", which
neither the agent's flags nor the resource controller parse. */}}
{{- define "aws-vpc-cni.scalar" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}
