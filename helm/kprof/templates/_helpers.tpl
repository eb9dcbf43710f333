{{/* Object name prefix: RELEASE-kprof, or RELEASE when it already holds the chart name. */}}
{{- define "kprof.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kprof.labels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include "kprof.selector" (list . "collectord") */}}
{{- define "kprof.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ default $.Chart.Name $.Values.nameOverride }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "kprof.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) | quote }}
{{- end -}}

{{/* Secret names: the user's existing ones, or the generated ones. */}}
{{- define "kprof.tlsSecret" -}}
{{- default (printf "%s-tls" (include "kprof.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}
{{- define "kprof.authSecret" -}}
{{- default (printf "%s-auth" (include "kprof.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}
{{- define "kprof.pgSecret" -}}
{{- default (printf "%s-pg" (include "kprof.fullname" .)) .Values.postgresql.existingSecret -}}
{{- end -}}

{{- define "kprof.pgHost" -}}
{{- if .Values.postgresql.bundled.enabled -}}
{{- printf "%s-postgresql" (include "kprof.fullname" .) -}}
{{- else -}}
{{- required "postgresql.external.host is required when postgresql.bundled.enabled is false" .Values.postgresql.external.host -}}
{{- end -}}
{{- end -}}

{{/* libpq conninfo for one user, without a password: include "kprof.conninfo" (list . USER) */}}
{{- define "kprof.conninfo" -}}
{{- $ := index . 0 -}}
{{- $pg := $.Values.postgresql -}}
{{- if $pg.bundled.enabled -}}
host={{ include "kprof.pgHost" $ }} port=5432 dbname={{ $pg.database }} user={{ index . 1 }} sslmode=prefer
{{- else -}}
host={{ include "kprof.pgHost" $ }} port={{ $pg.external.port }} dbname={{ $pg.database }} user={{ index . 1 }} sslmode={{ $pg.external.sslmode }}
{{- if $pg.external.sslRootCertSecret }} sslrootcert=/etc/kprof/pg-ca/ca.crt{{ end }}
{{- with $pg.external.extraConninfo }} {{ . }}{{ end }}
{{- end -}}
{{- end -}}

{{/* The settings every daemon's container shares. */}}
{{- define "kprof.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "kprof.podSecurity" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
runAsGroup: {{ .Values.runAsGroup }}
fsGroup: {{ .Values.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
An init container that copies the pod's secret files (mounted group-readable through fsGroup)
into a memory volume as files of mode 0600 owned by the daemon's user: the daemons refuse a
password or key file others or the group could read (common/kp_secret.h), and a Secret volume
cannot give a non-root user a 0600 file of its own.
*/}}
{{- define "kprof.secretsInit" -}}
- name: secrets
  image: {{ include "kprof.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [/bin/sh, -ec]
  args:
    - |
      cd /etc/kprof/secrets-in
      for f in *; do
        [ -f "$f" ] || continue
        cp -L "$f" "/run/kprof-secrets/$f"
        chmod 0600 "/run/kprof-secrets/$f"
      done
  securityContext:
    {{- include "kprof.containerSecurity" . | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 64Mi}
  volumeMounts:
    - {name: secrets-in, mountPath: /etc/kprof/secrets-in, readOnly: true}
    - {name: secrets, mountPath: /run/kprof-secrets}
{{- end -}}

{{/*
The daemons' security settings (collectord, analyzer). The token table is read where the
Secret is mounted (mode 0440 through fsGroup, which a token table may have): a new version of
the Secret reaches the files, and the daemons re-read the table, without a restart.
*/}}
{{- define "kprof.serverSecurityConf" -}}
tls-cert = /run/kprof-secrets/tls.crt
tls-key = /run/kprof-secrets/tls.key
auth-tokens = /etc/kprof/secrets-in/tokens
{{- if .Values.tls.clientCA }}
tls-client-ca = /run/kprof-secrets/ca.crt
{{- end }}
{{- end -}}

{{/* The projected secret volume of collectord and the analyzer: include "kprof.serverSecrets" (list . PASSWORD-KEY) */}}
{{- define "kprof.serverSecrets" -}}
{{- $ := index . 0 -}}
- name: secrets-in
  projected:
    defaultMode: 0440
    sources:
      - secret:
          name: {{ include "kprof.tlsSecret" $ }}
          items:
            - {key: ca.crt, path: ca.crt}
            - {key: tls.crt, path: tls.crt}
            - {key: tls.key, path: tls.key}
      - secret:
          name: {{ include "kprof.authSecret" $ }}
          items:
            - {key: tokens, path: tokens}
      - secret:
          name: {{ include "kprof.pgSecret" $ }}
          items:
            {{- range (slice . 1) }}
            - {key: {{ . }}, path: {{ . }}}
            {{- end }}
- name: secrets
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if and (not $.Values.postgresql.bundled.enabled) $.Values.postgresql.external.sslRootCertSecret }}
- name: pg-ca
  secret:
    secretName: {{ $.Values.postgresql.external.sslRootCertSecret }}
    items:
      - {key: ca.crt, path: ca.crt}
{{- end }}
{{- end -}}

{{- define "kprof.pgCaMount" -}}
{{- if and (not .Values.postgresql.bundled.enabled) .Values.postgresql.external.sslRootCertSecret }}
- {name: pg-ca, mountPath: /etc/kprof/pg-ca, readOnly: true}
{{- end }}
{{- end -}}

{{/* Liveness on /healthz and readiness on /readyz of the port named http. */}}
{{- define "kprof.probes" -}}
livenessProbe:
  httpGet: {path: /healthz, port: http}
  initialDelaySeconds: 5
  periodSeconds: 10
  failureThreshold: 6
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 5
  failureThreshold: 3
{{- end -}}
