package chart

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// networkPolicy is the shape of the rendered NetworkPolicy the tests
// assert on.
type networkPolicy struct {
	Spec struct {
		PodSelector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"podSelector"`
		PolicyTypes []string     `yaml:"policyTypes"`
		Ingress     []policyRule `yaml:"ingress"`
		Egress      []policyRule `yaml:"egress"`
	} `yaml:"spec"`
}

type policyRule struct {
	From  []policyPeer `yaml:"from"`
	To    []policyPeer `yaml:"to"`
	Ports []struct {
		Protocol string `yaml:"protocol"`
		Port     any    `yaml:"port"`
	} `yaml:"ports"`
}

type policyPeer struct {
	NamespaceSelector *struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"namespaceSelector"`
	PodSelector *struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"podSelector"`
	IPBlock *struct {
		CIDR string `yaml:"cidr"`
	} `yaml:"ipBlock"`
}

// ports lists a rule's ports as "protocol/port".
func (r policyRule) ports() []string {
	var out []string
	for _, p := range r.Ports {
		out = append(out, fmt.Sprintf("%s/%v", p.Protocol, p.Port))
	}
	slices.Sort(out)
	return out
}

// egressRules lists a policy's egress rules as "peers ports", the peers
// as CIDRs, "namespace N" or "N/dns-pod", "anywhere" without any.
func egressRules(np networkPolicy) []string {
	var egress []string
	for _, r := range np.Spec.Egress {
		to := "anywhere"
		if len(r.To) > 0 {
			var peers []string
			for _, p := range r.To {
				switch {
				case p.IPBlock != nil:
					peers = append(peers, p.IPBlock.CIDR)
				case p.NamespaceSelector != nil && p.PodSelector != nil:
					peers = append(peers, p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]+"/"+p.PodSelector.MatchLabels["k8s-app"])
				case p.NamespaceSelector != nil:
					peers = append(peers, "namespace "+p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
				default:
					peers = append(peers, "?")
				}
			}
			to = strings.Join(peers, ",")
		}
		egress = append(egress, to+" "+strings.Join(r.ports(), ","))
	}
	return egress
}

// The optional NetworkPolicy (/metrics and /readyz are unauthenticated,
// and service.type allows LoadBalancer) selects the
// release's pods, lets in only the selected namespaces, on the HTTP port,
// and lets out only Kafka (the brokers' ports), PostgreSQL and DNS, each
// to where the values say it is.
func TestNetworkPolicy(t *testing.T) {
	if _, ok := mustRender(t, minimalValues)["NetworkPolicy/dam-test"]; ok {
		t.Fatal("a NetworkPolicy by default: it is off unless enabled")
	}
	var np networkPolicy
	mustRender(t, fullValues).get(t, "NetworkPolicy", "dam-test").decode(t, &np)
	s := np.Spec
	if s.PodSelector.MatchLabels["app.kubernetes.io/name"] != "dam" || s.PodSelector.MatchLabels["app.kubernetes.io/instance"] != "dam-test" {
		t.Errorf("pod selector %v, want the release's pods", s.PodSelector.MatchLabels)
	}
	if !slices.Equal(s.PolicyTypes, []string{"Ingress", "Egress"}) {
		t.Errorf("policy types %v", s.PolicyTypes)
	}
	if len(s.Ingress) != 1 || !slices.Equal(s.Ingress[0].ports(), []string{"TCP/http-metrics"}) {
		t.Fatalf("ingress %+v: want one rule on the HTTP port", s.Ingress)
	}
	var namespaces []string
	for _, p := range s.Ingress[0].From {
		if p.NamespaceSelector == nil {
			t.Errorf("an ingress peer without a namespace selector: %+v", p)
			continue
		}
		namespaces = append(namespaces, p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
	}
	if !slices.Equal(namespaces, []string{"monitoring", "observability"}) {
		t.Errorf("ingress from namespaces %v, want monitoring and observability (full-values.yaml)", namespaces)
	}
	egress := egressRules(np)
	want := []string{
		"kube-system/kube-dns TCP/53,UDP/53",    // DNS
		"10.30.0.0/24,namespace kafka TCP/9093", // the brokers' port, from config.kafka.brokers, to where the values put them
		"10.20.0.0/16 TCP/5432",                 // PostgreSQL, from the values
	}
	if !slices.Equal(egress, want) {
		t.Errorf("egress\n%q\nwant\n%q", egress, want)
	}

	// Kafka's ports when set, and extra rules as given.
	mustRender(t, fullValues, "json:networkPolicy.egress.kafka.ports=[9092,9094]",
		`json:networkPolicy.egress.extra=[{"ports":[{"port":4317,"protocol":"TCP"}]}]`).get(t, "NetworkPolicy", "dam-test").decode(t, &np)
	var got []string
	for _, r := range np.Spec.Egress {
		got = append(got, strings.Join(r.ports(), ","))
	}
	if !slices.Equal(got, []string{"TCP/53,UDP/53", "TCP/9092,TCP/9094", "TCP/5432", "TCP/4317"}) {
		t.Errorf("egress ports %q", got)
	}
	// Without DNS.
	mustRender(t, fullValues, "networkPolicy.egress.dns.enabled=false").get(t, "NetworkPolicy", "dam-test").decode(t, &np)
	if len(np.Spec.Egress) != 2 {
		t.Errorf("egress without DNS: %+v", np.Spec.Egress)
	}
}

// The NetworkPolicy opens Kafka's and PostgreSQL's ports only to the
// peers the values give: without them it is not rendered, naming the key,
// rather than open those ports to any address.
func TestNetworkPolicyEgressNeedsDestinations(t *testing.T) {
	for _, key := range []string{"networkPolicy.egress.kafka.to", "networkPolicy.egress.postgres.to"} {
		out, err := render(t, fullValues, "json:"+key+"=[]")
		if err == nil {
			var np networkPolicy
			out.get(t, "NetworkPolicy", "dam-test").decode(t, &np)
			t.Errorf("%s=[]: rendered, egress %q; want it refused", key, egressRules(np))
			continue
		}
		if !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "any address") {
			t.Errorf("%s=[]: %v; want the key named", key, err)
		}
	}
}

// image.digest pins the image: every container runs repository@digest;
// anything but a sha256 digest is refused.
func TestImageDigest(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	spec := deploymentOf(t, mustRender(t, fullValues), "dam-test").Spec.Template.Spec
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Image != "registry.example/dam@"+digest {
			t.Errorf("container %s runs %s, want registry.example/dam@%s", c.Name, c.Image, digest)
		}
	}
	spec = deploymentOf(t, mustRender(t, minimalValues), "dam-test").Spec.Template.Spec
	if img := spec.Containers[0].Image; !strings.Contains(img, ":") || strings.Contains(img, "@") {
		t.Errorf("without a digest: %s, want repository:tag", img)
	}
	for _, bad := range []string{"0123", "sha256:xyz", "md5:0123456789abcdef0123456789abcdef"} {
		if _, err := render(t, minimalValues, "image.digest="+bad); err == nil || !strings.Contains(err.Error(), "digest") {
			t.Errorf("image.digest=%s: %v, want it refused", bad, err)
		}
	}
}
