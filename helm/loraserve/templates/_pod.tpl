{{/* The parts of a Ray pod shared by the head and the workers. */}}
{{/* S3 access as environment: AWS_* for boto, FSSPEC_S3_* for fsspec's s3fs options. */}}
{{- define "loraserve.s3Env" -}}
{{- if .endpoint }}
- name: AWS_ENDPOINT_URL_S3
  value: {{ .endpoint | quote }}
- name: FSSPEC_S3_ENDPOINT_URL
  value: {{ .endpoint | quote }}
{{- end }}
{{- if .region }}
- name: AWS_REGION
  value: {{ .region | quote }}
- name: AWS_DEFAULT_REGION
  value: {{ .region | quote }}
{{- end }}
{{- with .credentialsSecret }}
{{- if .name }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: {name: {{ .name | quote }}, key: {{ .accessKeyIdKey | quote }}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ .name | quote }}, key: {{ .secretAccessKeyKey | quote }}}
{{- end }}
{{- end }}
{{- end -}}

{{/* Environment of every Ray container (head and workers). */}}
{{- define "loraserve.rayEnv" -}}
- name: HOME
  value: {{ .Values.scratch.home | quote }}
{{- if include "loraserve.keysSecretName" . }}
{{- /* Read where the app is built: Serve runs the builder as a task, on the head in practice
     but on any node in principle, so every Ray container carries the keys. */}}
- name: LORASERVE_API_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ include "loraserve.keysSecretName" . | quote }}
      key: {{ include "loraserve.keysSecretKey" . | quote }}
{{- end }}
{{- if eq .Values.registry.type "s3" }}
{{- include "loraserve.s3Env" .Values.registry.s3 }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Volumes of a Ray pod. Argument: (list $ "head"|"worker"). The root filesystem is read-only,
so /tmp, Ray's session folder and HOME are emptyDirs. The /tmp/ray volume is named
ray-logs, as KubeRay names the one it shares with the autoscaler container: KubeRay then
mounts this one there instead of adding its own.
*/}}
{{- define "loraserve.volumes" -}}
{{- $ := index . 0 -}}{{- $role := index . 1 -}}
{{- $v := $.Values -}}
- name: config
  configMap:
    name: {{ include "loraserve.fullname" $ }}-config
- name: tmp
  emptyDir:
    {{- with $v.scratch.tmpSizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
- name: ray-logs
  emptyDir: {}
- name: home
  emptyDir: {}
{{- if or (eq $role "worker") (include "loraserve.headNeedsWeights" $) }}
{{- if eq $v.weights.source "pvc" }}
- name: weights
  persistentVolumeClaim:
    claimName: {{ $v.weights.pvc.claimName | quote }}
    readOnly: true
{{- else if eq $v.weights.cache.type "hostPath" }}
- name: weights
  hostPath:
    path: {{ $v.weights.cache.hostPath | quote }}
    type: DirectoryOrCreate
{{- else }}
- name: weights
  emptyDir:
    {{- with $v.weights.cache.sizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
{{- end }}
{{- end }}
{{- if eq $v.registry.type "pvc" }}
- name: registry
  persistentVolumeClaim:
    claimName: {{ default (printf "%s-registry" (include "loraserve.fullname" $)) $v.registry.pvc.existingClaim | quote }}
{{- end }}
{{- if eq $role "head" }}
- name: stores
  persistentVolumeClaim:
    claimName: {{ default (printf "%s-stores" (include "loraserve.fullname" $)) $v.stores.existingClaim | quote }}
{{- end }}
{{- end -}}

{{- define "loraserve.volumeMounts" -}}
{{- $ := index . 0 -}}{{- $role := index . 1 -}}
{{- $v := $.Values -}}
- {name: config, mountPath: {{ include "loraserve.configDir" $ }}, readOnly: true}
- {name: tmp, mountPath: /tmp}
- {name: ray-logs, mountPath: /tmp/ray}
- {name: home, mountPath: {{ $v.scratch.home | quote }}}
{{- if or (eq $role "worker") (include "loraserve.headNeedsWeights" $) }}
- {name: weights, mountPath: {{ $v.weights.mountPath | quote }}, readOnly: true}
{{- end }}
{{- if eq $v.registry.type "pvc" }}
- {name: registry, mountPath: {{ $v.registry.pvc.mountPath | quote }}}
{{- end }}
{{- if eq $role "head" }}
- {name: stores, mountPath: {{ $v.stores.mountPath | quote }}}
{{- end }}
{{- end -}}

{{/*
Init containers of a Ray pod: the S3 copy of the weights, through the serving code's own
copier (serving.model.checkpoint.resolve_model_path: atomic, reused once complete, so pods
sharing a hostPath cache copy the model once per node).
*/}}
{{- define "loraserve.initContainers" -}}
{{- $ := index . 0 -}}{{- $role := index . 1 -}}
{{- $v := $.Values -}}
{{- if and (eq $v.weights.source "s3") (or (eq $role "worker") (include "loraserve.headNeedsWeights" $)) }}
- name: fetch-weights
  image: {{ include "loraserve.image" $ | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command:
    - python
    - -c
    - |
      import sys
      from serving.model.checkpoint import resolve_model_path
      print("weights ready in", resolve_model_path(sys.argv[1], sys.argv[2]))
    - {{ $v.weights.s3.uri | quote }}
    - {{ $v.weights.mountPath | quote }}
  env:
    - name: HOME
      value: {{ $v.scratch.home | quote }}
    {{- include "loraserve.s3Env" $v.weights.s3 | trim | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    - {name: weights, mountPath: {{ $v.weights.mountPath | quote }}}
    - {name: tmp, mountPath: /tmp}
    - {name: home, mountPath: {{ $v.scratch.home | quote }}}
{{- end }}
{{- end -}}

{{/* Pod annotations that change when what the app reads at start changes, so a new
     config or new keys roll the cluster (KubeRay starts a new one, then switches). */}}
{{- define "loraserve.checksums" -}}
checksum/config: {{ include "loraserve.config" . | sha256sum }}
checksum/api-keys: {{ include "loraserve.keysValue" . | sha256sum }}
{{- end -}}
