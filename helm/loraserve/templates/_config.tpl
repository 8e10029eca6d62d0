{{/* The loraserve config and the Serve config rendered from values. */}}
{{/*
The loraserve config: .Values.config plus what the cluster decides. ModelServer replicas
get exactly one worker pod's GPUs and CPUs each, so deploy.* mirrors workers.*.
*/}}
{{- define "loraserve.config" -}}
{{- $v := .Values -}}
{{- $c := deepCopy ($v.config | default dict) -}}
{{- $root := include "loraserve.weightsRoot" . -}}
{{- $model := get $c "model" | default dict -}}
{{- $_ := set $model "path" (include "loraserve.inWeights" (list $root $v.weights.modelPath)) -}}
{{- $_ := set $c "model" $model -}}
{{- $draft := get $c "draft" | default dict -}}
{{- if $v.weights.draftPath -}}
{{- $_ := set $draft "path" (include "loraserve.inWeights" (list $root $v.weights.draftPath)) -}}
{{- end -}}
{{- $_ := set $c "draft" $draft -}}
{{- $lora := get $c "lora" | default dict -}}
{{- if eq $v.registry.type "s3" -}}
{{- $_ := set $lora "registry" $v.registry.s3.uri -}}
{{- else -}}
{{- $_ := set $lora "registry" $v.registry.pvc.mountPath -}}
{{- end -}}
{{- $preload := dict -}}
{{- range $name, $path := $v.preload -}}
{{- $_ := set $preload $name (include "loraserve.inWeights" (list $root $path)) -}}
{{- end -}}
{{- $_ := set $lora "preload" $preload -}}
{{- $_ := set $c "lora" $lora -}}
{{- $server := get $c "server" | default dict -}}
{{- /* Each replica listens here itself, on its pod's every address: the serve Service
     sends clients to the worker pods' port named serve, which is this one. */}}
{{- $_ := set $server "host" "0.0.0.0" -}}
{{- $_ := set $server "port" (int (include "loraserve.servePort" .)) -}}
{{- $_ := set $server "insecure" $v.insecure -}}
{{- $_ := set $server "api_keys_file" nil -}}
{{- $_ := set $c "server" $server -}}
{{- $resources := dict "num_gpus" (int $v.workers.gpusPerReplica) "num_cpus" (int $v.workers.cpusPerReplica) -}}
{{- $_ := set $c "deploy" (dict "num_replicas" (int $v.workers.replicas) "ray_address" nil "resources" $resources) -}}
{{- $batch := get $c "batch" | default dict -}}
{{- $_ := set $batch "store" (printf "sqlite:///%s/batch.db" $v.stores.mountPath) -}}
{{- $_ := set $c "batch" $batch -}}
{{- $_ := set $c "usage" (dict "store" (printf "sqlite:///%s/usage.db" $v.stores.mountPath)) -}}
{{- toYaml $c -}}
{{- end -}}

{{/*
The Ray Serve config KubeRay deploys once the head is ready (serveConfigV2). No HTTP proxy:
the replicas serve server.host:server.port themselves, and refuse to start beside a proxy,
which would also take their port. So no http_options either: nothing reads them.
*/}}
{{- define "loraserve.serveConfig" -}}
proxy_location: Disabled
applications:
  - name: loraserve
    import_path: serving.deploy.app:build
    route_prefix: /
    args:
      config: {{ include "loraserve.configDir" . }}/config.yaml
{{- end -}}
