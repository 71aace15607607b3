{{/* The release's base name, at most 52 characters (suffixes follow it). */}}
{{- define "detector.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "detector.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "detector.labels" -}}
{{ include "detector.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "detector.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret references every detector container gets: never a value. */}}
{{- define "detector.secretEnv" -}}
- name: DETECTOR_DATABASE__URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.secretName }}
      key: {{ .Values.database.secretKey }}
{{- if .Values.slack.enabled }}
{{- range $env, $key := dict "DETECTOR_SLACK__BOT_TOKEN" .Values.slack.botTokenKey "DETECTOR_SLACK__SIGNING_SECRET" .Values.slack.signingSecretKey "DETECTOR_SLACK__APP_TOKEN" .Values.slack.appTokenKey }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.slack.secretName }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- end }}
{{- with .Values.web.tokensSecretName }}
- name: DETECTOR_WEB__TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.web.tokensSecretKey }}
{{- end }}
{{- with .Values.web.sessionSecretName }}
- name: DETECTOR_WEB__SESSION_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.web.sessionSecretKey }}
{{- end }}
{{- end -}}

{{/* Volumes of every detector pod: a tmpdir, the runbook and workload files. */}}
{{- define "detector.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
- name: data
  emptyDir:
    sizeLimit: 64Mi
- name: config
  configMap:
    name: {{ include "detector.fullname" . }}
{{- end -}}

{{- define "detector.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: data
  mountPath: /data
- name: config
  mountPath: /etc/gpu-oom-detector
  readOnly: true
{{- end -}}
