{{/*
Helpers of the idempotent-events chart. Every name is prefixed with
"idempotent-events." so it cannot clash with a subchart's helpers.
*/}}

{{/* Chart name, overridable. */}}
{{- define "idempotent-events.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name prefix of every object: <release>-<chart>, or the release name when
it already contains the chart name. Kept at 50 characters so that suffixes
such as "-worker-metrics" stay within the 63-character DNS label limit.
*/}}
{{- define "idempotent-events.fullname" -}}
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

{{- define "idempotent-events.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select this release's pods; add app.kubernetes.io/component per component. */}}
{{- define "idempotent-events.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idempotent-events.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object of this chart. */}}
{{- define "idempotent-events.labels" -}}
helm.sh/chart: {{ include "idempotent-events.chart" . }}
{{ include "idempotent-events.selectorLabels" . }}
app.kubernetes.io/version: {{ include "idempotent-events.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: idempotent-events
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of a component's objects: call with (dict "ctx" $ "component" "receiver"). */}}
{{- define "idempotent-events.componentLabels" -}}
{{ include "idempotent-events.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Selector labels of a component's pods: call with (dict "ctx" $ "component" "receiver"). */}}
{{- define "idempotent-events.componentSelectorLabels" -}}
{{ include "idempotent-events.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "idempotent-events.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{/* The image reference; a digest wins over the tag. */}}
{{- define "idempotent-events.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (include "idempotent-events.imageTag" .) -}}
{{- end -}}
{{- end -}}

{{- define "idempotent-events.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "idempotent-events.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Name of a bundled subchart's objects (the subcharts use <release>-<name> or their fullnameOverride). */}}
{{- define "idempotent-events.subchartFullname" -}}
{{- $sub := index .ctx.Values .name -}}
{{- default (printf "%s-%s" .ctx.Release.Name .name) (dig "fullnameOverride" "" $sub) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Where a connection URL comes from, as a secretKeyRef body (name + key):
the bundled subchart's Secret (key "url") when it is enabled, else the
external existingSecret, else the chart's own Secret (external url value).
Call with (dict "ctx" $ "sub" "rabbitmq" "ext" .Values.externalRabbitmq "env" "AMQP_URL").
*/}}
{{- define "idempotent-events.urlSecretRef" -}}
{{- $sub := index .ctx.Values .sub -}}
{{- if $sub.enabled -}}
name: {{ include "idempotent-events.subchartFullname" (dict "ctx" .ctx "name" .sub) }}
key: url
{{- else if .ext.existingSecret -}}
name: {{ .ext.existingSecret }}
key: {{ .ext.existingSecretKey }}
{{- else if .ext.url -}}
name: {{ include "idempotent-events.fullname" .ctx }}
key: {{ .env }}
{{- else -}}
{{- fail (printf "%s: enable the bundled %s subchart (%s.enabled=true) or set the external service's url or existingSecret" .env .sub .sub) -}}
{{- end -}}
{{- end -}}

{{- define "idempotent-events.amqpSecretRef" -}}
{{- include "idempotent-events.urlSecretRef" (dict "ctx" . "sub" "rabbitmq" "ext" .Values.externalRabbitmq "env" "AMQP_URL") -}}
{{- end -}}

{{- define "idempotent-events.redisSecretRef" -}}
{{- include "idempotent-events.urlSecretRef" (dict "ctx" . "sub" "redis" "ext" .Values.externalRedis "env" "REDIS_URL") -}}
{{- end -}}

{{- define "idempotent-events.databaseSecretRef" -}}
{{- include "idempotent-events.urlSecretRef" (dict "ctx" . "sub" "postgresql" "ext" .Values.externalDatabase "env" "DATABASE_URL") -}}
{{- end -}}

{{- define "idempotent-events.webhookSecretRef" -}}
{{- if .Values.webhook.existingSecret -}}
name: {{ .Values.webhook.existingSecret }}
key: {{ .Values.webhook.existingSecretKey }}
{{- else -}}
name: {{ include "idempotent-events.fullname" . }}
key: WEBHOOK_SECRETS
{{- end -}}
{{- end -}}

{{/*
Name of a webhook source's secrets variable: WEBHOOK_SECRETS_<NAME>, the name
in upper case with "-" as "_" (config.SecretsVar in pkg/internal/config, the
one place the Go side writes it). Call with the source.
*/}}
{{- define "idempotent-events.sourceSecretsVar" -}}
{{- printf "WEBHOOK_SECRETS_%s" (.name | upper | replace "-" "_") -}}
{{- end -}}

{{/* WEBHOOK_SOURCES: "name:scheme,..." of webhook.sources. */}}
{{- define "idempotent-events.webhookSources" -}}
{{- $items := list -}}
{{- range .Values.webhook.sources -}}
{{- $items = append $items (printf "%s:%s" .name .scheme) -}}
{{- end -}}
{{- join "," $items -}}
{{- end -}}

{{/*
Where a webhook source's secrets come from, as a secretKeyRef body: its
existingSecret (key existingSecretKey, default WEBHOOK_SECRETS_<NAME>), else
the chart's own Secret. Call with (dict "ctx" $ "source" .).
*/}}
{{- define "idempotent-events.sourceSecretRef" -}}
{{- $var := include "idempotent-events.sourceSecretsVar" .source -}}
{{- with get .source "existingSecret" -}}
name: {{ . }}
key: {{ default $var (get $.source "existingSecretKey") }}
{{- else -}}
name: {{ include "idempotent-events.fullname" .ctx }}
key: {{ $var }}
{{- end -}}
{{- end -}}

{{/* True ("true") when some webhook source is a PayPal one. */}}
{{- define "idempotent-events.hasPayPalSource" -}}
{{- range .Values.webhook.sources -}}
{{- if eq .scheme "paypal" -}}
true
{{- break -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The receiver's volume of webhook signing secrets (webhook.secretsAsFiles): one
projected volume of every Secret key the variables would read, each a file
named after its variable (WEBHOOK_SECRETS, WEBHOOK_SECRETS_<NAME>).
*/}}
{{- define "idempotent-events.webhookSecretsVolume" -}}
{{- $default := include "idempotent-events.webhookSecretRef" . | fromYaml -}}
- name: webhook-secrets
  projected:
    # Group-readable through the pod's fsGroup, not world-readable.
    defaultMode: 0440
    sources:
      - secret:
          name: {{ $default.name | quote }}
          items:
            - key: {{ $default.key | quote }}
              path: WEBHOOK_SECRETS
      {{- range .Values.webhook.sources }}
      {{- $ref := include "idempotent-events.sourceSecretRef" (dict "ctx" $ "source" .) | fromYaml }}
      - secret:
          name: {{ $ref.name | quote }}
          items:
            - key: {{ $ref.key | quote }}
              path: {{ include "idempotent-events.sourceSecretsVar" . }}
      {{- end }}
{{- end -}}

{{/* True ("true") when some webhook source keeps its secrets in the chart's own Secret. */}}
{{- define "idempotent-events.sourcesInOwnSecret" -}}
{{- range .Values.webhook.sources -}}
{{- if not (get . "existingSecret") -}}
true
{{- break -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* ADMIN_TOKEN as a secretKeyRef body: admin.existingSecret, else the chart's own Secret. */}}
{{- define "idempotent-events.adminTokenSecretRef" -}}
{{- if .Values.admin.existingSecret -}}
name: {{ .Values.admin.existingSecret }}
key: {{ .Values.admin.existingSecretKey }}
{{- else -}}
name: {{ include "idempotent-events.fullname" . }}
key: ADMIN_TOKEN
{{- end -}}
{{- end -}}

{{/*
Name of the reconcile CronJob: the controller names each Job <cronjob>-<8
digits>, so the API server allows CronJob names of 52 characters at most.
*/}}
{{- define "idempotent-events.prune.name" -}}
{{- printf "%s-prune" (include "idempotent-events.fullname" . | trunc 46 | trimSuffix "-") -}}
{{- end -}}

{{- define "idempotent-events.reconcile.name" -}}
{{- printf "%s-reconcile" (include "idempotent-events.fullname" . | trunc 42 | trimSuffix "-") -}}
{{- end -}}

{{/*
STRIPE_API_KEY of the reconcile CronJob as a secretKeyRef body: always a
Secret the user manages (reconcile.stripe.existingSecret); the chart never
stores the key, so it refuses to render without one.
*/}}
{{- define "idempotent-events.reconcile.stripeSecretRef" -}}
{{- $s := .Values.reconcile.stripe -}}
{{- if not $s.existingSecret -}}
{{- fail "reconcile.enabled=true needs reconcile.stripe.existingSecret: a Secret holding STRIPE_API_KEY, a restricted key with read access to Events (the chart never stores the key)" -}}
{{- end -}}
name: {{ $s.existingSecret }}
key: {{ $s.existingSecretKey }}
{{- end -}}

{{/* TCP port of reconcile.apiURL: its explicit port, else 80 for http and 443 for https. */}}
{{- define "idempotent-events.reconcile.apiPort" -}}
{{- $u := urlParse .Values.reconcile.apiURL -}}
{{- if regexMatch ":[0-9]+$" $u.host -}}
{{- regexFind "[0-9]+$" $u.host -}}
{{- else if eq $u.scheme "http" -}}
80
{{- else -}}
443
{{- end -}}
{{- end -}}

{{/* True ("true") when the chart's own Secret has at least one key to hold. */}}
{{- define "idempotent-events.ownSecretNeeded" -}}
{{- if or (not .Values.webhook.existingSecret)
          (and (not .Values.rabbitmq.enabled) (not .Values.externalRabbitmq.existingSecret))
          (and (not .Values.redis.enabled) (not .Values.externalRedis.existingSecret))
          (and (not .Values.postgresql.enabled) (not .Values.externalDatabase.existingSecret))
          (and .Values.admin.enabled (not .Values.admin.existingSecret))
          (include "idempotent-events.sourcesInOwnSecret" .) -}}
true
{{- end -}}
{{- end -}}

{{/* WEBHOOK_SECRETS: the value, else the one already stored, else a new one (kept on upgrades). */}}
{{- define "idempotent-events.webhookSecrets" -}}
{{- if .Values.webhook.secrets -}}
{{- .Values.webhook.secrets -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "idempotent-events.fullname" .) -}}
{{- if and $existing (hasKey (default dict $existing.data) "WEBHOOK_SECRETS") -}}
{{- index $existing.data "WEBHOOK_SECRETS" | b64dec -}}
{{- else -}}
{{- printf "whsec_%s" (randAlphaNum 32) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Environment variables of the three connection URLs. */}}
{{- define "idempotent-events.connectionEnv" -}}
- name: AMQP_URL
  valueFrom:
    secretKeyRef:
      {{- include "idempotent-events.amqpSecretRef" . | nindent 6 }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      {{- include "idempotent-events.redisSecretRef" . | nindent 6 }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- include "idempotent-events.databaseSecretRef" . | nindent 6 }}
{{- include "idempotent-events.tlsEnv" (dict "ctx" . "services" (list "rabbitmq" "redis" "postgresql")) }}
{{- end -}}

{{/*
terminationGracePeriodSeconds of a component: preStop sleep + SHUTDOWN_TIMEOUT
+ margin, computed from the same values that set SHUTDOWN_TIMEOUT and the
preStop hook, so they cannot drift apart. Call with the component's values.
*/}}
{{- define "idempotent-events.terminationGracePeriodSeconds" -}}
{{- add .shutdown.preStopSleepSeconds .shutdown.timeoutSeconds .shutdown.graceMarginSeconds -}}
{{- end -}}

{{/*
True ("true") when the migration Job is a pre-install/pre-upgrade hook. The
exception is the first install with the bundled PostgreSQL: a pre-install hook
would wait for a database that is only created after the hooks, so then the Job
is an ordinary object and the pods' `migrate wait` init containers hold them.
*/}}
{{/* The release the worker pods belong to (WORKER_RELEASE): a rollback
reuses the manifest of the revision it returns to, so it names that one. */}}
{{- define "idempotent-events.workerRelease" -}}
{{- printf "%s-%d" .Release.Name (int .Release.Revision) -}}
{{- end -}}

{{- define "idempotent-events.migration.isHook" -}}
{{- if not (and .Values.postgresql.enabled .Release.IsInstall) -}}
true
{{- end -}}
{{- end -}}

{{/* Name of the Secret the migration Job reads DATABASE_URL from, as a secretKeyRef body. */}}
{{- define "idempotent-events.migration.databaseSecretRef" -}}
{{- if and (include "idempotent-events.migration.isHook" .) (not .Values.postgresql.enabled) (not .Values.externalDatabase.existingSecret) -}}
{{/* The chart's own Secret does not exist yet during pre-install: use the hook's copy. */}}
name: {{ include "idempotent-events.fullname" . }}-migration
key: DATABASE_URL
{{- else -}}
{{ include "idempotent-events.databaseSecretRef" . }}
{{- end -}}
{{- end -}}

{{/* The init container that holds a pod until the schema has no pending migration. */}}
{{- define "idempotent-events.waitForSchema" -}}
- name: wait-for-schema
  image: {{ include "idempotent-events.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["/usr/local/bin/migrate", "wait"]
  env:
    - name: LOG_LEVEL
      value: {{ .Values.config.logLevel | quote }}
    - name: LOG_FORMAT
      value: {{ .Values.config.logFormat | quote }}
    - name: MIGRATE_WAIT_TIMEOUT
      value: {{ .Values.migration.waitTimeout | quote }}
    - name: DATABASE_URL
      valueFrom:
        secretKeyRef:
          {{- include "idempotent-events.databaseSecretRef" . | nindent 10 }}
    {{- include "idempotent-events.tlsEnv" (dict "ctx" . "services" (list "postgresql")) | nindent 4 }}
  resources:
    {{- toYaml .Values.migration.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  {{- with include "idempotent-events.tlsVolumeMounts" (dict "ctx" . "services" (list "postgresql")) }}
  volumeMounts:
    {{- . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/*
Pod annotations that roll the pods when their configuration changes: hashes
of the values the ConfigMaps and the chart's Secret are made from (not of the
rendered files, so a generated secret does not roll pods on every upgrade).
*/}}
{{- define "idempotent-events.configChecksums" -}}
checksum/config: {{ list .Values.config .Values.receiver.config .Values.worker.config | toJson | sha256sum }}
{{- /* Secrets mounted as files are re-read by the receiver: a change of them rolls no pod. */}}
{{- $webhook := .Values.webhook }}
{{- if .Values.webhook.secretsAsFiles }}
{{- $webhook = omit .Values.webhook "secrets" "sources" }}
{{- end }}
checksum/secret: {{ list $webhook .Values.externalRabbitmq .Values.externalRedis .Values.externalDatabase .Values.admin | toJson | sha256sum }}
{{- end -}}

{{/*
PodDisruptionBudget spec body from {enabled, minAvailable, maxUnavailable}.
Helm drops keys whose value is null, hence hasKey.
*/}}
{{- define "idempotent-events.pdbBudget" -}}
{{- if and (hasKey . "minAvailable") (not (kindIs "invalid" (get . "minAvailable"))) -}}
minAvailable: {{ .minAvailable }}
{{- else -}}
maxUnavailable: {{ .maxUnavailable }}
{{- end -}}
{{- end -}}

{{/* The checks that values.schema.json cannot express. */}}
{{- define "idempotent-events.validate" -}}
{{- $adm := .Values.admin -}}
{{- if $adm.enabled -}}
{{- if not (or $adm.token $adm.existingSecret) -}}
{{- fail "admin.enabled=true needs admin.token (at least 16 characters) or admin.existingSecret (a Secret holding ADMIN_TOKEN); the chart does not generate the admin token" -}}
{{- end -}}
{{- if eq (int $adm.port) (int .Values.worker.metricsPort) -}}
{{- fail "admin.port must differ from worker.metricsPort" -}}
{{- end -}}
{{- end -}}
{{- $seen := dict -}}
{{- range .Values.webhook.sources -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "webhook.sources: source %q is listed twice" .name) -}}
{{- end -}}
{{- $_ := set $seen .name true -}}
{{- if not (or (get . "secrets") (get . "existingSecret")) -}}
{{- fail (printf "webhook.sources: source %q needs secrets or existingSecret" .name) -}}
{{- end -}}
{{- end -}}
{{- $a := .Values.worker.autoscaling -}}
{{- if $a.enabled -}}
{{- if gt (int $a.minReplicas) (int $a.maxReplicas) -}}
{{- fail "worker.autoscaling.minReplicas must not be greater than maxReplicas" -}}
{{- end -}}
{{- if and (eq $a.mode "hpa") (lt (int $a.minReplicas) 1) -}}
{{- fail "worker.autoscaling.minReplicas must be at least 1 in hpa mode (scaling to zero needs mode keda)" -}}
{{- end -}}
{{- if and (eq $a.mode "keda") (not (.Capabilities.APIVersions.Has "keda.sh/v1alpha1")) -}}
{{- fail "worker.autoscaling.mode=keda needs KEDA installed (the cluster does not serve keda.sh/v1alpha1); with helm template pass --api-versions keda.sh/v1alpha1" -}}
{{- end -}}
{{- if and (eq $a.mode "keda") (eq $a.keda.protocol "http") (not .Values.rabbitmq.enabled) (not $a.keda.managementUrlSecret.name) -}}
{{- fail "worker.autoscaling.keda.protocol=http needs worker.autoscaling.keda.managementUrlSecret.name (or the bundled rabbitmq)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
prometheus-adapter externalRules serving the worker HPA's External metric:
the series' namespace label maps to the HPA's namespace, and the HPA's
metricSelector (queue=events.main) becomes a label matcher.
*/}}
{{- define "idempotent-events.prometheusAdapterRules" -}}
{{- $a := .Values.worker.autoscaling -}}
externalRules:
  - seriesQuery: '{{ $a.hpa.prometheusAdapter.seriesName }}{queue!=""}'
    resources:
      overrides:
        namespace:
          resource: namespace
    name:
      matches: '^{{ $a.hpa.prometheusAdapter.seriesName }}$'
      as: {{ $a.hpa.metricName | quote }}
    metricsQuery: '{{ $a.hpa.prometheusAdapter.aggregation }}(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
{{- end -}}

{{/*
TLS to the services (values tls.*): each service's Secret, laid out as
cert-manager writes one (ca.crt, tls.crt, tls.key), mounted read-only as a
whole directory at <tls.mountPath>/<service> (never with subPath: the
kubelet updates only whole-volume mounts, and the binaries re-read the files
when they change), and the variables that point at its files. Call each
with (dict "ctx" $ "services" (list "rabbitmq" "redis" "postgresql")), the
services the pod's containers connect to.
*/}}
{{- define "idempotent-events.tlsPrefix" -}}
{{- get (dict "rabbitmq" "AMQP" "redis" "REDIS" "postgresql" "DATABASE") . -}}
{{- end -}}

{{- define "idempotent-events.tlsEnv" -}}
{{- $ctx := .ctx -}}
{{- range .services }}
{{- $t := index $ctx.Values.tls . }}
{{- $prefix := include "idempotent-events.tlsPrefix" . }}
{{- $dir := printf "%s/%s" $ctx.Values.tls.mountPath . }}
{{- if $t.existingSecret }}
{{- if $t.ca }}
- name: {{ $prefix }}_TLS_CA_FILE
  value: {{ printf "%s/ca.crt" $dir | quote }}
{{- end }}
{{- if $t.clientCertificate }}
- name: {{ $prefix }}_TLS_CERT_FILE
  value: {{ printf "%s/tls.crt" $dir | quote }}
- name: {{ $prefix }}_TLS_KEY_FILE
  value: {{ printf "%s/tls.key" $dir | quote }}
{{- end }}
{{- end }}
{{- if $t.required }}
- name: {{ $prefix }}_TLS_REQUIRED
  value: "true"
{{- end }}
{{- end }}
{{- end -}}

{{- define "idempotent-events.tlsVolumeMounts" -}}
{{- $ctx := .ctx -}}
{{- range .services }}
{{- if (index $ctx.Values.tls .).existingSecret }}
- name: tls-{{ . }}
  mountPath: {{ printf "%s/%s" $ctx.Values.tls.mountPath . | quote }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{- define "idempotent-events.tlsVolumes" -}}
{{- $ctx := .ctx -}}
{{- range .services }}
{{- $t := index $ctx.Values.tls . }}
{{- if $t.existingSecret }}
- name: tls-{{ . }}
  secret:
    secretName: {{ $t.existingSecret | quote }}
    # Group-readable through the pod's fsGroup; the key is not world-readable.
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end -}}
