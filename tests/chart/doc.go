// Package chart tests the Helm chart in charts/dam by rendering it with
// the real helm binary (built by `make helm`, found through $HELM or
// bin/helm-*) and asserting on the rendered objects: the ConfigMap's
// routes, the probes, the securityContext, the Secret references, the
// grace period, the fail guards, and that dam itself accepts the
// configuration the chart renders. It has no code of its own.
package chart
