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

{{/*
Kafka (kafka.enabled): the librdkafka properties of collectord and the sinks, one string for
--kafka-property (KPROF_KAFKA_PROPERTY in the environment: kprof reads KPROF_<KEY>): the user's
kafka.properties, the files of the TLS Secrets, and SASL's user and password as references to
the variables that come from kafka.sasl.existingSecret, which Kubernetes expands in the
container, so that no password is in the ConfigMap or the pod's spec.
*/}}
{{- define "kprof.kafkaProperties" -}}
{{- $k := .Values.kafka -}}
{{- $props := list -}}
{{- $secretKeys := list "sasl.password" "ssl.key.password" "sasl.oauthbearer.client.secret" "ssl.keystore.password" "ssl.key.pem" -}}
{{- range $key := keys $k.properties | sortAlpha -}}
{{- $v := toString (index $k.properties $key) -}}
{{- if has $key $secretKeys -}}
{{- fail (printf "kafka.properties.%s holds a secret, which would be in the pod's spec: put SASL's credentials in kafka.sasl.existingSecret (keys username and password) and key files in kafka.tls.clientSecret" $key) -}}
{{- end -}}
{{- if or (contains "," $v) (contains ";" $v) -}}
{{- fail (printf "kafka.properties.%s: a value may not hold ',' or ';' (they separate --kafka-property's settings)" $key) -}}
{{- end -}}
{{- $props = append $props (printf "%s=%s" $key $v) -}}
{{- end -}}
{{- $ssl := or $k.tls.caSecret $k.tls.clientSecret -}}
{{- if not (hasKey $k.properties "security.protocol") -}}
{{- if and $ssl $k.sasl.existingSecret -}}
{{- $props = append $props "security.protocol=SASL_SSL" -}}
{{- else if $ssl -}}
{{- $props = append $props "security.protocol=SSL" -}}
{{- else if $k.sasl.existingSecret -}}
{{- $props = append $props "security.protocol=SASL_SSL" -}}
{{- end -}}
{{- end -}}
{{- if $k.tls.caSecret -}}
{{- $props = append $props "ssl.ca.location=/etc/kprof/kafka-ca/ca.crt" -}}
{{- end -}}
{{- if $k.tls.clientSecret -}}
{{- $props = append $props "ssl.certificate.location=/etc/kprof/kafka-client/tls.crt" -}}
{{- $props = append $props "ssl.key.location=/etc/kprof/kafka-client/tls.key" -}}
{{- end -}}
{{- if $k.sasl.existingSecret -}}
{{- $props = append $props "sasl.username=$(KAFKA_SASL_USERNAME)" -}}
{{- $props = append $props "sasl.password=$(KAFKA_SASL_PASSWORD)" -}}
{{- end -}}
{{- join "," $props -}}
{{- end -}}

{{/* The environment of a Kafka client container (collectord with kafka.enabled, the sinks). */}}
{{- define "kprof.kafkaEnv" -}}
{{- $k := .Values.kafka -}}
{{- if $k.sasl.existingSecret }}
- name: KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef: {name: {{ $k.sasl.existingSecret }}, key: username}
- name: KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $k.sasl.existingSecret }}, key: password}
{{- end }}
{{- with include "kprof.kafkaProperties" . }}
- name: KPROF_KAFKA_PROPERTY
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "kprof.kafkaMounts" -}}
{{- if .Values.kafka.tls.caSecret }}
- {name: kafka-ca, mountPath: /etc/kprof/kafka-ca, readOnly: true}
{{- end }}
{{- if .Values.kafka.tls.clientSecret }}
- {name: kafka-client, mountPath: /etc/kprof/kafka-client, readOnly: true}
{{- end }}
{{- end -}}

{{- define "kprof.kafkaVolumes" -}}
{{- if .Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.tls.caSecret }}
    defaultMode: 0440
    items:
      - {key: ca.crt, path: ca.crt}
{{- end }}
{{- if .Values.kafka.tls.clientSecret }}
- name: kafka-client
  secret:
    secretName: {{ .Values.kafka.tls.clientSecret }}
    defaultMode: 0440
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
{{- end -}}

{{/* The headless Service that gives each collectord replica a DNS name (kafka.enabled). */}}
{{- define "kprof.collectordPods" -}}
{{- printf "%s-collectord-pods" (include "kprof.fullname" .) -}}
{{- end -}}
