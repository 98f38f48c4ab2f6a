// Command validate checks the Herald Helm chart (deploy/helm/herald) with Helm's own Go SDK:
//
//   - `helm lint` (pkg/lint) with the chart's values and with every example values file;
//   - renders the chart (pkg/engine) for the chart's values and every example;
//   - decodes every rendered object strictly into its Kubernetes Go type (k8s.io/api, and the
//     prometheus-operator's ServiceMonitor): an unknown or misspelt field is an error;
//   - checks the invariants the drain depends on (docs/deploy.md, "Helm chart"): readiness asks
//     /ready and liveness /health on the container's port; terminationGracePeriodSeconds exceeds
//     the preStop sleep + drain_ms + the node's 2 s; liveness failureThreshold × periodSeconds
//     exceeds drain_ms + 2 s (the listener is closed while the node drains); the HERALD_DRAIN_MS
//     the chart passes is the binary's default (read from crates/core/src/config.rs) unless the
//     example overrides it; a non-root security context; Service, PDB, HPA and ServiceMonitor
//     pointing at the Deployment's pods and port; the HPA's metric exported by a real node (with
//     -metrics, a saved /metrics page).
//
// Usage: go run . [-chart DIR] [-examples DIR] [-config-rs FILE] [-metrics FILE]
// It prints one line per case and exits 1 with every failure listed.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// The Kubernetes version the chart is rendered and linted for (its kubeVersion is >=1.30).
const kubeVersion = "v1.31.0"

// The node keeps draining up to this long past drain_ms (crates/server/src/serve.rs).
const drainExtraMs = 2000

func main() {
	chartDir := flag.String("chart", "../herald", "the chart directory")
	examplesDir := flag.String("examples", "", "example values files (default: CHART/examples)")
	configRs := flag.String("config-rs", "../../../crates/core/src/config.rs",
		"the source file whose Default sets drain_ms")
	metricsFile := flag.String("metrics", "", "a node's /metrics page: the HPA's metric must be in it")
	heraldBin := flag.String("herald", "", "a herald binary: each in-memory case is started with the rendered settings, and its /metrics checks the HPA's metric")
	show := flag.String("show", "", "print the rendered manifests of this case (values.yaml or an example's file name)")
	flag.Parse()
	if *examplesDir == "" {
		*examplesDir = filepath.Join(*chartDir, "examples")
	}

	var failures []string
	failf := func(format string, a ...any) { failures = append(failures, fmt.Sprintf(format, a...)) }

	defaultDrain, err := binaryDrainDefault(*configRs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "validate: %v\n", err)
		os.Exit(2)
	}
	var metrics string
	if *metricsFile != "" {
		b, err := os.ReadFile(*metricsFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "validate: -metrics: %v\n", err)
			os.Exit(2)
		}
		metrics = string(b)
	}

	ch, err := loader.Load(*chartDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "validate: loading the chart %s: %v\n", *chartDir, err)
		os.Exit(1)
	}
	// The chart's own default must be the binary's.
	if d, ok := intAt(ch.Values, "herald", "drainMs"); !ok || d != defaultDrain {
		failf("values.yaml: herald.drainMs is %v, the binary's default drain_ms is %d (%s)",
			ch.Values["herald"].(map[string]any)["drainMs"], defaultDrain, *configRs)
	}

	examples, _ := filepath.Glob(filepath.Join(*examplesDir, "*.yaml"))
	sort.Strings(examples)
	if len(examples) == 0 {
		failf("no example values files in %s", *examplesDir)
	}
	cases := append([]string{""}, examples...)
	ranMetrics := ""
	var tried []string
	for _, file := range cases {
		name := "values.yaml"
		vals := map[string]any{}
		if file != "" {
			name = filepath.Base(file)
			v, err := chartutil.ReadValuesFile(file)
			if err != nil {
				failf("%s: %v", name, err)
				continue
			}
			vals = v
		}
		before := len(failures)
		caseFail := func(format string, a ...any) { failf(name+": "+format, a...) }

		// helm lint, as `helm lint -f FILE` runs it.
		kv, _ := chartutil.ParseKubeVersion(kubeVersion)
		linter := lint.AllWithKubeVersion(*chartDir, vals, "herald", kv)
		for _, m := range linter.Messages {
			if m.Severity >= support.WarningSev {
				caseFail("helm lint: %s", m)
			}
		}

		objects, err := render(ch, vals)
		if *show == name {
			for _, o := range objects {
				fmt.Printf("---\n# %s\n%s\n", o.file, o.doc)
			}
		}
		if err != nil {
			caseFail("render: %v", err)
			continue
		}
		expectDrain := defaultDrain
		if d, ok := intAt(vals, "herald", "drainMs"); ok {
			expectDrain = d
		}
		if *heraldBin != "" && brokerOf(objects) != "memory" {
			if err := brokerConfigAccepted(*heraldBin, objects); err != nil {
				caseFail("running herald with the rendered settings (broker unreachable): %v", err)
			} else {
				tried = append(tried, name)
			}
		}
		if *heraldBin != "" && brokerOf(objects) == "memory" {
			m, err := runNode(*heraldBin, objects)
			if err != nil {
				caseFail("running herald with the rendered settings: %v", err)
			} else if metrics == "" {
				metrics = m
				ranMetrics = name
			}
		}
		checkObjects(objects, expectDrain, metrics, caseFail)
		if len(failures) == before {
			kinds := map[string]int{}
			for _, o := range objects {
				kinds[o.kind]++
			}
			fmt.Printf("ok   %-20s %d objects %v\n", name, len(objects), kinds)
		} else {
			fmt.Printf("FAIL %-20s\n", name)
		}
	}
	// Values the chart must refuse, with a message saying what to fix.
	refusals := []struct{ name, values, want string }{
		{"the memory broker with 3 replicas", "replicaCount: 3", "broker.type memory serves one node"},
		{"the memory broker autoscaled", "autoscaling: {enabled: true}", "broker.type memory serves one node"},
		{"redis without a URL", "{broker: {type: redis}, replicaCount: 2}", "broker.redis.url is required"},
		{"redis-cluster without nodes", "{broker: {type: redis-cluster}, replicaCount: 2}", "broker.redisCluster.nodes"},
		{"nats without URLs", "{broker: {type: nats}, replicaCount: 2}", "broker.nats.urls is required"},
		{"an unknown broker (values.schema.json)", "broker: {type: kafka}", "at '/broker/type': value must be one of 'memory', 'redis', 'redis-cluster', 'nats'"},
		{"a grace period shorter than the drain", "terminationGracePeriodSeconds: 10", "terminationGracePeriodSeconds 10 is too short"},
		{"no Secret at all", "secrets: {create: false}", "secrets.create false needs secrets.existingSecret"},
		{"a misspelt value (values.schema.json)", "herald: {drainMS: 3000}", "at '/herald': additional properties 'drainMS' not allowed"},
	}
	for _, r := range refusals {
		vals, err := chartutil.ReadValues([]byte(r.values))
		if err != nil {
			failf("refusal %q: %v", r.name, err)
			continue
		}
		_, err = render(ch, vals)
		switch {
		case err == nil:
			failf("the chart renders %s (%s): it must refuse it with %q", r.name, r.values, r.want)
		case !strings.Contains(err.Error(), r.want):
			failf("the chart refuses %s with %q, want a message with %q", r.name, err, r.want)
		default:
			fmt.Printf("ok   refuses %s\n", r.name)
		}
	}

	if len(failures) > 0 {
		fmt.Fprintln(os.Stderr, "\nthe chart is broken:")
		for _, f := range failures {
			fmt.Fprintln(os.Stderr, "  - "+f)
		}
		os.Exit(1)
	}
	fmt.Printf("chart OK: lint and %d renders, every object strictly decoded, %d bad values refused\n", len(cases), len(refusals))
	if ranMetrics != "" {
		fmt.Printf("the node started with %s's settings; its /metrics has the HPA's metric\n", ranMetrics)
		fmt.Printf("the node took the settings of %s and stopped at connecting to the (closed) broker port\n", strings.Join(tried, ", "))
	} else if *metricsFile == "" {
		fmt.Println("(no -herald binary: the chart's settings were not tried on a node)")
	}
}

// binaryDrainDefault reads `drain_ms: N` from the config's Default impl.
func binaryDrainDefault(path string) (int, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading the binary's defaults: %v", err)
	}
	m := regexp.MustCompile(`(?m)^\s*drain_ms:\s*([0-9_]+),`).FindSubmatch(src)
	if m == nil {
		return 0, fmt.Errorf("%s: no `drain_ms: N,` default found", path)
	}
	return strconv.Atoi(strings.ReplaceAll(string(m[1]), "_", ""))
}

// intAt reads an integer at a path of nested maps (YAML numbers come as float64 or int64).
func intAt(m map[string]any, path ...string) (int, bool) {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return 0, false
		}
		if cur, ok = mm[p]; !ok {
			return 0, false
		}
	}
	switch v := cur.(type) {
	case float64:
		return int(v), true
	case int64:
		return int(v), true
	case int:
		return v, true
	}
	return 0, false
}

type object struct {
	file, kind, name, doc string
	obj                   any
}

func render(ch *chart.Chart, vals map[string]any) ([]object, error) {
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = *kv
	opts := chartutil.ReleaseOptions{Name: "herald", Namespace: "herald", Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(ch, vals, opts, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []object
	for _, n := range names {
		if !strings.HasSuffix(n, ".yaml") {
			continue
		}
		for i, doc := range splitDocs(files[n]) {
			o, err := decode(doc)
			if err != nil {
				return nil, fmt.Errorf("%s (document %d): %v", n, i+1, err)
			}
			o.file = n
			out = append(out, o)
		}
	}
	return out, nil
}

func splitDocs(s string) []string {
	var docs []string
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(s, -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// decode picks the Go type by apiVersion and kind and decodes strictly: unknown fields and
// duplicate keys are errors.
func decode(doc string) (object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
		return object{}, fmt.Errorf("not YAML: %v", err)
	}
	var obj any
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 Secret":
		obj = &corev1.Secret{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "autoscaling/v2 HorizontalPodAutoscaler":
		obj = &autoscalingv2.HorizontalPodAutoscaler{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		obj = &monitoringv1.ServiceMonitor{}
	default:
		return object{}, fmt.Errorf("%q %q: no Go type known to this validator (add one)", head.APIVersion, head.Kind)
	}
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
		return object{}, fmt.Errorf("%s %s: %v", head.Kind, head.Metadata.Name, err)
	}
	if head.Metadata.Name == "" {
		return object{}, fmt.Errorf("%s without metadata.name", head.Kind)
	}
	return object{kind: head.Kind, name: head.Metadata.Name, doc: strings.TrimSpace(doc), obj: obj}, nil
}

func checkObjects(objects []object, expectDrain int, metrics string, fail func(string, ...any)) {
	byKind := map[string][]object{}
	for _, o := range objects {
		byKind[o.kind] = append(byKind[o.kind], o)
	}
	deps := byKind["Deployment"]
	if len(deps) != 1 {
		fail("%d Deployments rendered, want 1", len(deps))
		return
	}
	d := deps[0].obj.(*appsv1.Deployment)
	pod := d.Spec.Template.Spec
	podLabels := d.Spec.Template.Labels
	if d.Spec.Selector == nil || !subset(d.Spec.Selector.MatchLabels, podLabels) {
		fail("Deployment: selector does not match the pod template's labels")
	}
	var c *corev1.Container
	for i := range pod.Containers {
		if pod.Containers[i].Name == "herald" {
			c = &pod.Containers[i]
		}
	}
	if c == nil {
		fail("Deployment: no container named herald")
		return
	}
	portName := ""
	for _, p := range c.Ports {
		if p.Name == "http" {
			portName = p.Name
		}
	}
	if portName == "" {
		fail("container herald: no port named http")
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			fail("container herald: env %s set twice", e.Name)
		}
		env[e.Name] = e
	}

	// Probes.
	probe := func(what string, p *corev1.Probe, path string) {
		switch {
		case p == nil:
			fail("container herald: no %s probe", what)
		case p.HTTPGet == nil:
			fail("%s probe: not an httpGet", what)
		case p.HTTPGet.Path != path:
			fail("%s probe asks %q, want %q", what, p.HTTPGet.Path, path)
		case p.HTTPGet.Port.String() != portName && p.HTTPGet.Port.String() != portNumber(c):
			fail("%s probe port %s is not the container's http port", what, p.HTTPGet.Port.String())
		}
	}
	probe("readiness", c.ReadinessProbe, "/ready")
	probe("liveness", c.LivenessProbe, "/health")

	// drain_ms, preStop, grace period, liveness tolerance.
	drain := -1
	if e, ok := env["HERALD_DRAIN_MS"]; !ok {
		fail("container herald: no HERALD_DRAIN_MS (the chart must pass the drain it plans for)")
	} else if n, err := strconv.Atoi(e.Value); err != nil {
		fail("HERALD_DRAIN_MS %q is not an integer", e.Value)
	} else {
		drain = n
		if n != expectDrain {
			fail("HERALD_DRAIN_MS is %d, want %d (the binary's default, or the example's herald.drainMs)", n, expectDrain)
		}
	}
	preStopS := int64(0)
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if s := c.Lifecycle.PreStop.Sleep; s != nil {
			preStopS = s.Seconds
		} else {
			fail("preStop is not a sleep action (the image has no shell for an exec hook)")
		}
	}
	if drain >= 0 {
		need := preStopS*1000 + int64(drain) + drainExtraMs
		if pod.TerminationGracePeriodSeconds == nil {
			fail("no terminationGracePeriodSeconds (default 30 s)")
		} else if tg := *pod.TerminationGracePeriodSeconds * 1000; tg <= need {
			fail("terminationGracePeriodSeconds %d s is not above preStop %d s + drain_ms %d ms + %d ms",
				*pod.TerminationGracePeriodSeconds, preStopS, drain, drainExtraMs)
		}
		if l := c.LivenessProbe; l != nil {
			window := int64(l.FailureThreshold) * int64(l.PeriodSeconds) * 1000
			if l.FailureThreshold == 0 || l.PeriodSeconds == 0 {
				window = 3 * 10 * 1000 // Kubernetes' defaults
			}
			if window <= int64(drain)+drainExtraMs {
				fail("liveness failureThreshold %d × periodSeconds %d s is not above drain_ms %d ms + %d ms: a draining node (listener closed) could be restarted",
					l.FailureThreshold, l.PeriodSeconds, drain, drainExtraMs)
			}
		}
	}

	// Non-root.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		fail("pod securityContext: runAsNonRoot is not true")
	}
	if psc != nil && psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		fail("pod securityContext: runAsUser 0")
	}
	if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		fail("container securityContext: allowPrivilegeEscalation is not false")
	} else if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
		fail("container securityContext: runAsUser 0")
	}

	// Reachable from outside the pod, and a broker URL.
	if e := env["HERALD_BIND"]; e.Value != "0.0.0.0" && e.Value != "::" {
		fail("HERALD_BIND is %q: the node would listen on loopback only", e.Value)
	}
	if e, ok := env["HERALD_BROKER_URL"]; !ok || e.Value == "" {
		fail("no HERALD_BROKER_URL")
	} else if !regexp.MustCompile(`^(memory|rediss?(\+cluster|\+sentinel|\+shards)?://\S+|(nats|tls)://\S+)$`).MatchString(e.Value) {
		fail("HERALD_BROKER_URL %q is not a broker URL Herald takes", e.Value)
	} else if e.Value == "memory" && (d.Spec.Replicas == nil || *d.Spec.Replicas != 1) {
		fail("the memory broker with %v replicas: each pod would be a separate Herald", d.Spec.Replicas)
	}
	if e, ok := env["HERALD_API_KEY"]; !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		fail("HERALD_API_KEY does not come from a Secret")
	}
	secrets := map[string]*corev1.Secret{}
	for _, o := range byKind["Secret"] {
		secrets[o.name] = o.obj.(*corev1.Secret)
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		s, ok := secrets[ref.Name]
		if !ok {
			continue // an existingSecret
		}
		if _, ok := s.Data[ref.Key]; !ok && (ref.Optional == nil || !*ref.Optional) {
			fail("%s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
		}
	}

	// The other objects point at these pods and this port.
	for _, o := range byKind["Service"] {
		s := o.obj.(*corev1.Service)
		if len(s.Spec.Selector) == 0 || !subset(s.Spec.Selector, podLabels) {
			fail("Service %s: selector does not match the pods", o.name)
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.String() != portName && p.TargetPort.String() != portNumber(c) {
				fail("Service %s: targetPort %s is not the container's http port", o.name, p.TargetPort.String())
			}
		}
	}
	if len(byKind["Service"]) == 0 {
		fail("no Service")
	}
	for _, o := range byKind["PodDisruptionBudget"] {
		p := o.obj.(*policyv1.PodDisruptionBudget)
		if p.Spec.Selector == nil || !subset(p.Spec.Selector.MatchLabels, podLabels) {
			fail("PodDisruptionBudget %s: selector does not match the pods", o.name)
		}
		if p.Spec.MinAvailable != nil && d.Spec.Replicas != nil && p.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas) {
			fail("PodDisruptionBudget %s: minAvailable %s blocks every eviction", o.name, p.Spec.MinAvailable)
		}
	}
	for _, o := range byKind["HorizontalPodAutoscaler"] {
		h := o.obj.(*autoscalingv2.HorizontalPodAutoscaler)
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != deps[0].name {
			fail("HPA %s scales %s/%s, not the Deployment %s", o.name, h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name, deps[0].name)
		}
		if d.Spec.Replicas != nil {
			fail("HPA %s and a fixed Deployment replicas: each upgrade would reset the scale", o.name)
		}
		for _, m := range h.Spec.Metrics {
			switch {
			case m.Type == autoscalingv2.PodsMetricSourceType && m.Pods != nil:
				name := m.Pods.Metric.Name
				if metrics != "" && !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`[ {]`).MatchString(metrics) {
					fail("HPA %s: metric %s is not in a node's /metrics", o.name, name)
				}
			case m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource != nil:
				if _, ok := c.Resources.Requests[m.Resource.Name]; !ok {
					fail("HPA %s: %s utilisation without a %s request", o.name, m.Resource.Name, m.Resource.Name)
				}
			}
		}
		if len(h.Spec.Metrics) == 0 {
			fail("HPA %s without metrics", o.name)
		}
	}
	for _, o := range byKind["ServiceMonitor"] {
		sm := o.obj.(*monitoringv1.ServiceMonitor)
		for _, e := range sm.Spec.Endpoints {
			if e.Port != portName || e.Path != "/metrics" {
				fail("ServiceMonitor %s: endpoint %s%s, want port http, path /metrics", o.name, e.Port, e.Path)
			}
		}
	}
}

func portNumber(c *corev1.Container) string {
	for _, p := range c.Ports {
		if p.Name == "http" {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return "-"
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// brokerOf is the rendered HERALD_BROKER_URL of the herald container.
func brokerOf(objects []object) string {
	for _, o := range objects {
		if d, ok := o.obj.(*appsv1.Deployment); ok {
			for _, c := range d.Spec.Template.Spec.Containers {
				for _, e := range c.Env {
					if e.Name == "HERALD_BROKER_URL" {
						return e.Value
					}
				}
			}
		}
	}
	return ""
}
