{{/* Labels on every object; selectors use only sdg.selectorLabels (as config/default). */}}
{{- define "sdg.labels" -}}
app.kubernetes.io/name: shared-device-group
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: shared-device-group
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The manager pods. Fixed like config/default's, so that selectors (immutable) match a
kustomize install that is adopted by this chart. */}}
{{- define "sdg.selectorLabels" -}}
app.kubernetes.io/name: shared-device-group
app.kubernetes.io/component: manager
{{- end -}}

{{- define "sdg.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}:{{ $tag }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* "true" when cert-manager issues the webhook certificate, "" when the chart does. */}}
{{- define "sdg.certManager" -}}
{{- $source := .Values.certificates.source -}}
{{- if eq $source "cert-manager" -}}
true
{{- else if eq $source "auto" -}}
{{- if .Capabilities.APIVersions.Has "cert-manager.io/v1/Certificate" -}}true{{- end -}}
{{- else if ne $source "helm" -}}
{{- fail (printf "certificates.source %q: expected auto, cert-manager or helm" $source) -}}
{{- end -}}
{{- end -}}

{{- define "sdg.webhookService" -}}deviceshare-webhook-service{{- end -}}
{{- define "sdg.certSecret" -}}webhook-server-cert{{- end -}}
{{- define "sdg.certificate" -}}deviceshare-serving-cert{{- end -}}

{{/* The Service's in-cluster DNS names, which the serving certificate must cover. */}}
{{- define "sdg.dnsNames" -}}
{{- $svc := printf "%s.%s.svc" (include "sdg.webhookService" .) .Release.Namespace -}}
{{ toJson (list $svc (printf "%s.cluster.local" $svc)) }}
{{- end -}}

{{/* Each YAML document of the chart's files matching a glob (links into config/), as a
JSON list. Reading config/'s files keeps the CRD, the admission policies and the RBAC rules
identical to the kustomize install instead of a copy that could drift. */}}
{{- define "sdg.documents" -}}
{{- $docs := list -}}
{{- range $path, $_ := .root.Files.Glob .glob -}}
{{- range regexSplit "(?m)^---[ \t]*$" ($.root.Files.Get $path) -1 -}}
{{- $doc := fromYaml . -}}
{{- if $doc.Error -}}
{{- fail (printf "%s: %s" $path $doc.Error) -}}
{{- end -}}
{{- if and $doc.kind (not (hasPrefix "kustomize.config.k8s.io/" ($doc.apiVersion | default ""))) -}}
{{- $docs = append $docs $doc -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{ toJson $docs }}
{{- end -}}
