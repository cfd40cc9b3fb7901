package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var (
	minimalValues = []string{filepath.Join(chartDir, "ci", "minimal-values.yaml")}
	fullValues    = []string{filepath.Join(chartDir, "ci", "full-values.yaml")}
	envValues     = []string{filepath.Join(chartDir, "ci", "env-secrets-values.yaml")}
)

// TestCIValues lints and renders the chart with every ci/ value set and
// checks which objects each renders.
func TestCIValues(t *testing.T) {
	want := map[string][]string{
		"minimal-values.yaml":     {"ConfigMap/dam-test", "Deployment/dam-test", "PodDisruptionBudget/dam-test", "Service/dam-test", "ServiceAccount/dam-test"},
		"env-secrets-values.yaml": {"ConfigMap/dam-test", "Deployment/dam-test", "Service/dam-test", "ServiceAccount/dam-test"},
		"full-values.yaml": {"ConfigMap/dam-test", "ConfigMap/dam-test-dashboard", "Deployment/dam-test", "NetworkPolicy/dam-test", "PodDisruptionBudget/dam-test",
			"PrometheusRule/dam-test", "Service/dam-test", "ServiceAccount/dam-test", "ServiceMonitor/dam-test"},
	}
	files := ciValues(t)
	if len(files) != len(want) {
		t.Errorf("ci value sets %v; this test knows %d", files, len(want))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if out, err := helm(t, "lint", "--strict", chartDir, "-f", f); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			r := mustRender(t, []string{f})
			var got []string
			for k := range r {
				got = append(got, k)
			}
			slices.Sort(got)
			if w, ok := want[filepath.Base(f)]; ok && !slices.Equal(got, w) {
				t.Errorf("rendered %v, want %v", got, w)
			}
		})
	}
}

// TestConfigMapRoutes: the ConfigMap holds the values' routes and
// settings as dam's keys, with what the chart owns filled in.
func TestConfigMapRoutes(t *testing.T) {
	var values struct {
		Routes []map[string]any `yaml:"routes"`
		Config map[string]any   `yaml:"config"`
	}
	raw, err := os.ReadFile(fullValues[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(damConfig(t, mustRender(t, fullValues), "dam-test")), &cfg); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg["routes"], anySlice(values.Routes)) {
		t.Errorf("routes\n%v\nwant the values' routes\n%v", cfg["routes"], values.Routes)
	}
	for _, section := range []string{"kafka", "postgres", "log", "pipeline"} {
		if path, ok := within(values.Config[section], cfg[section], section); !ok {
			t.Errorf("config.%s of the values is not in the ConfigMap's %s: %v", path, section, cfg[section])
		}
	}
	if got := cfg["http"]; !reflect.DeepEqual(got, map[string]any{"listen": ":9191"}) {
		t.Errorf("http %v, want listen :9191 (service.port)", got)
	}
	pg := cfg["postgres"].(map[string]any)
	if pg["migrate"] != false || pg["max_conns"] != 12 {
		t.Errorf("postgres %v: want migrate false (the init container migrates) and max_conns 12", pg)
	}
	if _, ok := pg["dsn"]; ok {
		t.Errorf("the ConfigMap holds a DSN: %v", pg)
	}

	// The group defaults to the release's full name.
	var minimal struct {
		Kafka struct {
			Group string `yaml:"group"`
		} `yaml:"kafka"`
	}
	if err := yaml.Unmarshal([]byte(damConfig(t, mustRender(t, minimalValues), "dam-test")), &minimal); err != nil {
		t.Fatal(err)
	}
	if minimal.Kafka.Group != "dam-test" {
		t.Errorf("default group %q, want the release's full name", minimal.Kafka.Group)
	}
}

// within reports whether every key of want is in got with the same value
// (recursively for mappings), and the first path that is not.
func within(want, got any, path string) (string, bool) {
	wm, ok := want.(map[string]any)
	if !ok {
		return path, reflect.DeepEqual(want, got)
	}
	gm, ok := got.(map[string]any)
	if !ok {
		return path, false
	}
	for k, v := range wm {
		if p, ok := within(v, gm[k], path+"."+k); !ok {
			return p, false
		}
	}
	return "", true
}

func anySlice[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func TestProbes(t *testing.T) {
	for _, tc := range []struct {
		files []string
		port  int
	}{{minimalValues, 9090}, {fullValues, 9191}} {
		c := deploymentOf(t, mustRender(t, tc.files), "dam-test").dam()
		if len(c.Ports) != 1 || c.Ports[0].Name != "http-metrics" || c.Ports[0].ContainerPort != tc.port {
			t.Errorf("%v: ports %+v, want http-metrics %d", tc.files, c.Ports, tc.port)
		}
		for _, p := range []struct {
			name, path string
			probe      *probe
		}{{"liveness", "/healthz", c.LivenessProbe}, {"readiness", "/readyz", c.ReadinessProbe}} {
			if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port != "http-metrics" {
				t.Errorf("%v: %s probe %+v, want GET %s on http-metrics", tc.files, p.name, p.probe, p.path)
			}
		}
		if c.LivenessProbe.FailureThreshold != 6 || c.ReadinessProbe.PeriodSeconds != 5 {
			t.Errorf("probe settings not taken from the values: %+v %+v", c.LivenessProbe, c.ReadinessProbe)
		}
	}
}

func TestSecurityContext(t *testing.T) {
	for _, files := range [][]string{minimalValues, fullValues, envValues} {
		spec := deploymentOf(t, mustRender(t, files), "dam-test").Spec.Template.Spec
		if sc := spec.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == 0 {
			t.Errorf("%v: pod securityContext %+v: want non-root", files, sc)
		}
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Errorf("%v: the service account token is mounted", files)
		}
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			sc := c.SecurityContext
			if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				!slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || len(sc.Capabilities.Add) > 0 ||
				(sc.Privileged != nil && *sc.Privileged) {
				t.Errorf("%v: container %s securityContext %+v", files, c.Name, sc)
			}
		}
	}
}

// TestSecretReferences: the DSN and the SASL password come from the
// existing Secret, as mounted files or as variables, in every dam
// container (the migrating init container too), and nowhere else.
func TestSecretReferences(t *testing.T) {
	t.Run("files", func(t *testing.T) {
		spec := deploymentOf(t, mustRender(t, fullValues), "dam-test").Spec.Template.Spec
		var secretVol *volume
		for i, v := range spec.Volumes {
			if v.Secret != nil && v.Name == "secrets" {
				secretVol = &spec.Volumes[i]
			}
		}
		if secretVol == nil || secretVol.Secret.SecretName != "dam-invoices" {
			t.Fatalf("no volume of Secret dam-invoices: %+v", spec.Volumes)
		}
		paths := map[string]string{}
		for _, it := range secretVol.Secret.Items {
			paths[it.Key] = it.Path
		}
		if len(paths) != 2 || paths["postgres-dsn"] == "" || paths["kafka-password"] == "" {
			t.Fatalf("secret items %v: want the keys postgres-dsn and kafka-password", paths)
		}
		if len(spec.InitContainers) != 1 {
			t.Fatalf("init containers %+v", spec.InitContainers)
		}
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			mounted := false
			for _, m := range c.VolumeMounts {
				if m.Name == "secrets" && m.MountPath == "/run/secrets/dam" && m.ReadOnly {
					mounted = true
				}
			}
			if !mounted {
				t.Errorf("%s: secrets not mounted read-only at /run/secrets/dam: %+v", c.Name, c.VolumeMounts)
			}
			for env, key := range map[string]string{"DAM_POSTGRES_DSN_FILE": "postgres-dsn", "DAM_KAFKA_SASL_PASSWORD_FILE": "kafka-password"} {
				if e := c.env(env); e == nil || e.Value != "/run/secrets/dam/"+paths[key] {
					t.Errorf("%s: %s = %+v, want the mounted file of key %s", c.Name, env, e, key)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil {
					t.Errorf("%s: %s from a Secret although secret.as is file", c.Name, e.Name)
				}
			}
		}
	})
	t.Run("env", func(t *testing.T) {
		spec := deploymentOf(t, mustRender(t, envValues), "dam-test").Spec.Template.Spec
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				t.Errorf("a Secret volume although secret.as is env: %+v", v)
			}
		}
		if len(spec.InitContainers) != 0 {
			t.Errorf("init containers with migrate atStart: %+v", spec.InitContainers)
		}
		c := spec.Containers[0]
		for env, key := range map[string]string{"DAM_POSTGRES_DSN": "dsn", "DAM_KAFKA_SASL_PASSWORD": "sasl"} {
			e := c.env(env)
			if e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
				e.ValueFrom.SecretKeyRef.Name != "dam-customer-7" || e.ValueFrom.SecretKeyRef.Key != key {
				t.Errorf("%s = %+v, want key %s of Secret dam-customer-7", env, e, key)
			}
		}
	})
	t.Run("no SASL", func(t *testing.T) {
		spec := deploymentOf(t, mustRender(t, minimalValues), "dam-test").Spec.Template.Spec
		c := spec.Containers[0]
		if c.env("DAM_KAFKA_SASL_PASSWORD_FILE") != nil || c.env("DAM_KAFKA_SASL_PASSWORD") != nil {
			t.Errorf("a SASL password without a mechanism: %+v", c.Env)
		}
		for _, v := range spec.Volumes {
			if v.Secret != nil && (len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != "dsn" || v.Secret.SecretName != "dam-customer-2") {
				t.Errorf("secret volume %+v: want only key dsn of dam-customer-2", v.Secret)
			}
		}
	})
}

func TestGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		sets  []string
		want  int
	}{
		{"default: shutdown_grace 30s + 15", minimalValues, nil, 45},
		{"explicit", fullValues, nil, 90},
		{"minutes and seconds", minimalValues, []string{"config.pipeline.shutdown_grace=1m30s"}, 105},
		{"fractions round up", minimalValues, []string{"config.pipeline.shutdown_grace=1500ms"}, 17},
		{"one second above", minimalValues, []string{"terminationGracePeriodSeconds=31"}, 31},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := deploymentOf(t, mustRender(t, tc.files, tc.sets...), "dam-test").Spec.Template.Spec.TerminationGracePeriodSeconds
			if got != tc.want {
				t.Errorf("terminationGracePeriodSeconds %d, want %d", got, tc.want)
			}
		})
	}
}

func TestGoMemLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		sets  []string
		want  string // "" for none
	}{
		{"512Mi × 0.9", minimalValues, nil, "483183820"},
		{"1Gi × 0.9", fullValues, nil, "966367641"},
		{"1G × 0.5", minimalValues, []string{"resources.limits.memory=1G", "json:goMemLimitRatio=0.5"}, "500000000"},
		{"bytes", minimalValues, []string{"resources.limits.memory=1000000", "goMemLimitRatio=1"}, "1000000"},
		{"no memory limit", envValues, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := deploymentOf(t, mustRender(t, tc.files, tc.sets...), "dam-test").dam()
			e := c.env("GOMEMLIMIT")
			switch {
			case tc.want == "" && e != nil:
				t.Errorf("GOMEMLIMIT %q without a memory limit", e.Value)
			case tc.want != "" && (e == nil || e.Value != tc.want):
				t.Errorf("GOMEMLIMIT %+v, want %s", e, tc.want)
			}
		})
	}
}

func TestMigrate(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		init    bool
		migrate bool
	}{{"initContainer", true, false}, {"atStart", false, true}, {"none", false, false}} {
		t.Run(tc.mode, func(t *testing.T) {
			r := mustRender(t, minimalValues, "migrate="+tc.mode)
			spec := deploymentOf(t, r, "dam-test").Spec.Template.Spec
			if got := len(spec.InitContainers) == 1; got != tc.init {
				t.Fatalf("init containers %+v", spec.InitContainers)
			}
			if tc.init {
				ic, c := spec.InitContainers[0], spec.Containers[0]
				if !slices.Equal(ic.Args, []string{"migrate", "--config", "/etc/dam/dam.yaml"}) || ic.Image != c.Image {
					t.Errorf("init container %+v: want dam migrate with the pod's image and config", ic)
				}
				if !reflect.DeepEqual(ic.VolumeMounts, c.VolumeMounts) {
					t.Errorf("init container mounts %+v, dam's %+v", ic.VolumeMounts, c.VolumeMounts)
				}
				if !reflect.DeepEqual(ic.Env, c.Env[1:]) || c.Env[0].Name != "GOMEMLIMIT" {
					t.Errorf("init container env %+v, dam's %+v", ic.Env, c.Env)
				}
			}
			var cfg struct {
				Postgres struct {
					Migrate bool `yaml:"migrate"`
				} `yaml:"postgres"`
			}
			if err := yaml.Unmarshal([]byte(damConfig(t, r, "dam-test")), &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.Postgres.Migrate != tc.migrate {
				t.Errorf("postgres.migrate %v, want %v", cfg.Postgres.Migrate, tc.migrate)
			}
		})
	}
}

// TestFailGuards: values that contradict each other or cannot work are
// refused at render time, each naming what is wrong.
func TestFailGuards(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		sets  []string
		want  string
	}{
		{"no Secret", minimalValues, []string{"secret.name="}, "secret.name: required"},
		{"no brokers", minimalValues, []string{"config.kafka.brokers=null"}, "config.kafka.brokers: required"},
		{"no routes", minimalValues, []string{"json:routes=[]"}, "routes: at least one route is required"},
		{"to is from", minimalValues, []string{"routes[0].to=projections.customer-2"}, `routes[0].to: "projections.customer-2" is also the route's from`},
		{"to is another route's from", fullValues, []string{"routes[1].to=projections.invoices"}, `routes[1].to: topic "projections.invoices" is the from topic of routes[0]`},
		{"dead letter is to", fullValues, []string{"routes[0].dead_letter=delivery.invoices"}, `routes[0].dead_letter: topic "delivery.invoices" is also the route's to topic`},
		{"dead letter is a from", fullValues, []string{"routes[0].dead_letter=projections.invoices-raw"}, `routes[0].dead_letter: topic "projections.invoices-raw" is the from topic of routes[1]`},
		{"two routes read one topic", fullValues, []string{"routes[1].from=projections.invoices"}, `routes[1].from: topic "projections.invoices" is already read by routes[0]`},
		{"two routes, one service", fullValues, []string{"routes[1].service=invoices"}, `routes[1].service: "invoices" is already the service of routes[0]`},
		{"SASL without user", fullValues, []string{"config.kafka.sasl.username="}, "config.kafka.sasl.username: required with config.kafka.sasl.mechanism"},
		{"SASL without password key", fullValues, []string{"secret.saslPasswordKey="}, "secret.saslPasswordKey: required with config.kafka.sasl.mechanism"},
		{"more replicas than partitions", fullValues, []string{"replicaCount=7"}, "replicaCount (7) exceeds inputPartitions (6)"},
		{"grace period not above shutdown_grace", minimalValues, []string{"terminationGracePeriodSeconds=30"}, "terminationGracePeriodSeconds (30) must exceed config.pipeline.shutdown_grace (30s)"},
		{"grace period below a long shutdown_grace", fullValues, []string{"config.pipeline.shutdown_grace=2m"}, "terminationGracePeriodSeconds (90) must exceed config.pipeline.shutdown_grace (2m)"},
		{"both PDB bounds", minimalValues, []string{"podDisruptionBudget.minAvailable=1"}, "podDisruptionBudget: set minAvailable or maxUnavailable, not both"},
		{"bad memory limit", minimalValues, []string{"resources.limits.memory=lots"}, `resources.limits.memory: memory quantity "lots"`},
		// values.schema.json
		{"bad duration", minimalValues, []string{"config.pipeline.shutdown_grace=30 seconds"}, "shutdown_grace"},
		{"unknown setting", minimalValues, []string{"config.kafka.brokerz=x"}, "brokerz"},
		{"unknown route key", minimalValues, []string{"routes[0].fromm=x"}, "fromm"},
		{"route without to", minimalValues, []string{"routes[0].to=null"}, "to"},
		{"secrets neither file nor env", minimalValues, []string{"secret.as=volume"}, "secret.as"},
		{"a DSN in the values", minimalValues, []string{"config.postgres.dsn=postgres://dam:pw@db/dam"}, "dsn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.files, tc.sets...)
			if err == nil {
				t.Fatalf("rendered; want an error with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// TestPrometheusRuleIsTheRulesFile: the chart's PrometheusRule is the
// plain rules file, which promtool checks and tests.
func TestPrometheusRuleIsTheRulesFile(t *testing.T) {
	var rule struct {
		Spec map[string]any `yaml:"spec"`
	}
	mustRender(t, fullValues).get(t, "PrometheusRule", "dam-test").decode(t, &rule)
	var file map[string]any
	raw, err := os.ReadFile(filepath.Join(chartDir, "alerts", "dam.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file["groups"].([]any)) == 0 || !reflect.DeepEqual(rule.Spec, file) {
		t.Fatalf("PrometheusRule spec\n%v\ndiffers from alerts/dam.rules.yaml\n%v", rule.Spec, file)
	}
	var names []string
	for _, g := range file["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			names = append(names, r.(map[string]any)["alert"].(string))
		}
	}
	slices.Sort(names)
	want := []string{"DamDeadLetters", "DamDecisionLatencyHigh", "DamDown", "DamHalted", "DamLagGrowing", "DamNoProgress", "DamStoreErrors"}
	if !slices.Equal(names, want) {
		t.Errorf("alerts %v, want %v", names, want)
	}
}

// TestDashboard: the dashboard ConfigMap carries dashboards/dam.json, a
// dashboard Grafana can import by hand (its data source is a variable).
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "dam.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cm configMap
	mustRender(t, fullValues).get(t, "ConfigMap", "dam-test-dashboard").decode(t, &cm)
	if strings.TrimSpace(cm.Data["dam.json"]) != strings.TrimSpace(string(raw)) {
		t.Error("the dashboard ConfigMap differs from dashboards/dam.json")
	}
	var d struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name, Type string
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboards/dam.json: %v", err)
	}
	if d.UID == "" || len(d.Templating.List) == 0 || d.Templating.List[0].Type != "datasource" {
		t.Fatalf("dashboard without a uid or a datasource variable: %+v", d.Templating)
	}
	ids := map[int]bool{}
	var titles []string
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		titles = append(titles, p.Title)
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %q, %d targets", p.Title, p.Datasource.UID, len(p.Targets))
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: empty expression", p.Title)
			}
		}
	}
	for _, want := range []string{"Records/s by service", "Duplicate-drop rate", "Decide latency p50 / p99", "Poll-to-commit p99",
		"Consumer lag per partition", "Halted partitions", "Dead letters", "Store and delivery errors", "State rows"} {
		if !slices.Contains(titles, want) {
			t.Errorf("no panel %q in %v", want, titles)
		}
	}
}

// TestValuesDocumented: every key of values.yaml has a comment above it
// (or on its line).
func TestValuesDocumented(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, n *yaml.Node)
	keys := 0
	walk = func(path string, n *yaml.Node) {
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := strings.TrimPrefix(path+"."+k.Value, ".")
			keys++
			if strings.TrimSpace(k.HeadComment) == "" && strings.TrimSpace(k.LineComment) == "" {
				t.Errorf("values.yaml: %s has no doc comment", p)
			}
			walk(p, v)
		}
	}
	walk("", doc.Content[0])
	if keys < 50 {
		t.Fatalf("only %d keys found in values.yaml", keys)
	}
}
