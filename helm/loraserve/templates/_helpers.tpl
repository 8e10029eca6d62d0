{{/* Names and labels. */}}
{{- define "loraserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "loraserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{/* 40 characters: KubeRay names its clusters and pods after the RayService, adding suffixes. */}}

{{- define "loraserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loraserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "loraserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "loraserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "loraserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "loraserve.serveServiceName" -}}
{{- printf "%s-serve" (include "loraserve.fullname" .) -}}
{{- end -}}

{{/*
The port the API is served on: every ModelServer replica listens on it itself (the config's
server.port), and the Ray containers name it "serve", the port KubeRay's serve Service targets.
*/}}
{{- define "loraserve.servePort" -}}8000{{- end -}}

{{/* The label ("true") that lets a pod of the release's namespace call the Serve port. */}}
{{- define "loraserve.clientLabel" -}}
{{- printf "%s-client" (include "loraserve.fullname" .) -}}
{{- end -}}

{{/* Where the config lives in every Ray pod; the Serve app's args name this file. */}}
{{- define "loraserve.configDir" -}}/etc/loraserve{{- end -}}

{{/* The Secret and key that hold LORASERVE_API_KEYS, or nothing when the server is keyless. */}}
{{- define "loraserve.keysSecretName" -}}
{{- if .Values.apiKeys.existingSecret.name -}}
{{- .Values.apiKeys.existingSecret.name -}}
{{- else if .Values.apiKeys.keys -}}
{{- printf "%s-api-keys" (include "loraserve.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "loraserve.keysSecretKey" -}}
{{- if .Values.apiKeys.existingSecret.name -}}
{{- .Values.apiKeys.existingSecret.key -}}
{{- else -}}
LORASERVE_API_KEYS
{{- end -}}
{{- end -}}

{{/*
The folder the weights volume is mounted at, as the replicas see it. An S3 copy lands in
<cache>/<sha256 of the URI>: serving.model.checkpoint.resolve_model_path's rule, which the
init container runs.
*/}}
{{- define "loraserve.weightsRoot" -}}
{{- $w := .Values.weights -}}
{{- if eq $w.source "s3" -}}
{{- printf "%s/%s" $w.mountPath (sha256sum $w.s3.uri) -}}
{{- else -}}
{{- $w.mountPath -}}
{{- end -}}
{{- end -}}

{{- define "loraserve.inWeights" -}}
{{- $root := index . 0 -}}{{- $sub := index . 1 -}}
{{- if $sub -}}{{- printf "%s/%s" $root $sub -}}{{- else -}}{{- $root -}}{{- end -}}
{{- end -}}

{{- define "loraserve.draftMethod" -}}
{{- dig "draft" "method" "none" (.Values.config | default dict) -}}
{{- end -}}

{{/* Whether the app's builder reads model files (draft vocabulary check, preloads). */}}
{{- define "loraserve.headNeedsWeights" -}}
{{- if or .Values.preload (eq (include "loraserve.draftMethod" .) "draft_model") -}}true{{- end -}}
{{- end -}}

{{/*
Refuse values that would deploy something broken or open. The schema checks each value;
these checks span several.
*/}}
{{- define "loraserve.validate" -}}
{{- $v := .Values -}}
{{- if and (not $v.apiKeys.keys) (not $v.apiKeys.existingSecret.name) (not $v.insecure) -}}
{{- fail "no API keys: set apiKeys.keys or apiKeys.existingSecret.name (or insecure: true for a private dev cluster, where every caller is an admin)" -}}
{{- end -}}
{{- if and $v.apiKeys.keys $v.apiKeys.existingSecret.name -}}
{{- fail "set apiKeys.keys or apiKeys.existingSecret.name, not both" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $v.apiKeys.keys -}}
{{- if hasKey $seen .key -}}{{- fail "apiKeys.keys: a key is listed twice" -}}{{- end -}}
{{- $_ := set $seen .key true -}}
{{- end -}}
{{- if and (eq $v.weights.source "pvc") (not $v.weights.pvc.claimName) -}}
{{- fail "weights.source is pvc: set weights.pvc.claimName, the claim holding the model" -}}
{{- end -}}
{{- if and (eq $v.weights.source "s3") (not $v.weights.s3.uri) -}}
{{- fail "weights.source is s3: set weights.s3.uri (s3://bucket/prefix)" -}}
{{- end -}}
{{- if and (eq (include "loraserve.draftMethod" .) "draft_model") (not $v.weights.draftPath) -}}
{{- fail "config.draft.method is draft_model: set weights.draftPath, the draft model's folder in the weights volume" -}}
{{- end -}}
{{- if and (eq $v.registry.type "s3") (not $v.registry.s3.uri) -}}
{{- fail "registry.type is s3: set registry.s3.uri (s3://bucket/prefix)" -}}
{{- end -}}
{{- if $v.autoscaling.enabled -}}
{{- if gt (int $v.autoscaling.minReplicas) (int $v.workers.replicas) -}}
{{- fail "autoscaling.minReplicas exceeds workers.replicas" -}}
{{- end -}}
{{- if lt (int $v.autoscaling.maxReplicas) (int $v.workers.replicas) -}}
{{- fail "autoscaling.maxReplicas is below workers.replicas: the replicas would never all start" -}}
{{- end -}}
{{- end -}}
{{- end -}}


{{- define "loraserve.keysValue" -}}
{{- $entries := list -}}
{{- range .Values.apiKeys.keys -}}
{{- $entries = append $entries (printf "%s:%s:%s" .key .tenant .scope) -}}
{{- end -}}
{{- join "," $entries -}}
{{- end -}}
