// Package deploytest checks the Kubernetes delivery of idempotent-events
// offline, on a machine without Docker or a cluster:
//
//   - the Helm chart renders with the Helm SDK in strict mode (a misspelled
//     .Values reference fails) for every charts/idempotent-events/ci/*-values.yaml
//     scenario and every offline-only one in testdata/*-values.yaml (values
//     make k8s-e2e cannot install, such as the reconcile CronJob's, which needs
//     a Stripe key), with and without the monitoring.coreos.com/v1 and
//     keda.sh/v1alpha1 APIs, passes Helm's lint rules, and values.schema.json
//     rejects bad values;
//   - every rendered object decodes strictly into its Kubernetes API type
//     (unknown fields rejected) and has the properties the chart promises
//     (probes, resources, security context, hooks, autoscaling, selectors);
//   - a real kube-apiserver (envtest, built from hack/tools) accepts every
//     built-in object in a server-side dry run with strict field validation;
//   - kind-config.yaml decodes strictly into kind's config types, the
//     Tiltfile runs in Starlark against stub Tilt builtins and names
//     resources the chart renders, and the Dockerfile passes BuildKit's
//     parser and lint rules;
//   - the Dockerfile's go build command, run as written, makes static
//     binaries that start;
//   - the chart/binary contract: for the default values and every scenario,
//     each container that runs receiver, worker or migrate gets its
//     environment resolved as the kubelet would (env, envFrom with prefix,
//     ConfigMap and Secret references, the downward API) and that binary,
//     built from this tree, passes --check-config with exactly it; the
//     reconcile CronJob's container likewise passes `eventsctl reconcile
//     -check-config` with its arguments and environment.
//
// Run it with hack/check-deploy.sh, which builds the tools it needs first.
package deploytest
