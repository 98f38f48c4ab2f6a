package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// runNode starts the real herald binary the way the rendered Deployment's container would run
// (its args, and its env with Secret and field references resolved; the ConfigMap's herald.toml
// written to a temporary file), except HERALD_PORT=0 and HERALD_BIND=127.0.0.1 so that it takes a
// free loopback port. It checks that the node accepts that configuration and starts, that
// /health and /ready answer 200, that SIGTERM makes it exit 0 within drain_ms + 5 s, and returns
// its /metrics page. Only for the in-memory broker (other brokers need their servers).
func runNode(bin string, objects []object) (metrics string, err error) {
	return startNode(bin, objects, false)
}

// brokerConfigAccepted starts the binary like runNode for a case with a broker server (Redis,
// Redis Cluster, NATS), with the broker URL pointed at a closed port (127.0.0.1:1, same scheme):
// the node must get past its configuration (every HERALD_* the chart passes accepted) and stop
// at connecting to the broker, which is what the message it exits with says.
func brokerConfigAccepted(bin string, objects []object) error {
	_, err := startNode(bin, objects, true)
	return err
}

func startNode(bin string, objects []object, brokerDown bool) (metrics string, err error) {
	var dep *appsv1.Deployment
	secrets := map[string]*corev1.Secret{}
	configMaps := map[string]*corev1.ConfigMap{}
	for _, o := range objects {
		switch v := o.obj.(type) {
		case *appsv1.Deployment:
			dep = v
		case *corev1.Secret:
			secrets[o.name] = v
		case *corev1.ConfigMap:
			configMaps[o.name] = v
		}
	}
	if dep == nil || len(dep.Spec.Template.Spec.Containers) == 0 {
		return "", fmt.Errorf("no Deployment container to run")
	}
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	dir, err := os.MkdirTemp("", "herald-chart-node-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)

	// Mounted ConfigMaps become files under dir, and args naming them point there.
	mounts := map[string]string{}
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != vm.Name || v.ConfigMap == nil {
				continue
			}
			cm, ok := configMaps[v.ConfigMap.Name]
			if !ok {
				return "", fmt.Errorf("volume %s: ConfigMap %s not rendered", v.Name, v.ConfigMap.Name)
			}
			local := filepath.Join(dir, v.Name)
			if err := os.MkdirAll(local, 0o755); err != nil {
				return "", err
			}
			for k, data := range cm.Data {
				if err := os.WriteFile(filepath.Join(local, k), []byte(data), 0o644); err != nil {
					return "", err
				}
			}
			mounts[vm.MountPath] = local
		}
	}
	args := append([]string{}, c.Command...)
	args = append(args, c.Args...)
	for i, a := range args {
		for mount, local := range mounts {
			if strings.HasPrefix(a, mount+"/") {
				args[i] = local + strings.TrimPrefix(a, mount)
			}
		}
	}

	env := []string{}
	drainMs := 5000
	for _, e := range c.Env {
		value := e.Value
		if e.ValueFrom != nil {
			switch {
			case e.ValueFrom.FieldRef != nil:
				value = "herald-chart-test"
			case e.ValueFrom.SecretKeyRef != nil:
				ref := e.ValueFrom.SecretKeyRef
				s, ok := secrets[ref.Name]
				data, has := []byte(nil), false
				if ok {
					data, has = s.Data[ref.Key]
				}
				if !has {
					if ref.Optional != nil && *ref.Optional {
						continue
					}
					return "", fmt.Errorf("%s: Secret %s key %s not rendered", e.Name, ref.Name, ref.Key)
				}
				value = string(data)
			default:
				return "", fmt.Errorf("%s: a valueFrom this check cannot resolve", e.Name)
			}
		}
		switch e.Name {
		case "HERALD_PORT":
			value = "0"
		case "HERALD_BIND":
			value = "127.0.0.1"
		case "HERALD_DRAIN_MS":
			fmt.Sscan(value, &drainMs)
		case "HERALD_BROKER_URL":
			if brokerDown {
				scheme, _, ok := strings.Cut(value, "://")
				if !ok {
					return "", fmt.Errorf("HERALD_BROKER_URL %q has no scheme", value)
				}
				value = scheme + "://127.0.0.1:1"
			}
		}
		env = append(env, e.Name+"="+value)
	}

	cmd := exec.Command(bin, args...)
	cmd.Env = env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	stderr, err := os.CreateTemp(dir, "stderr")
	if err != nil {
		return "", err
	}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	}()
	logs := func() string {
		b, _ := os.ReadFile(stderr.Name())
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		return "\n      " + strings.Join(lines, "\n      ")
	}

	if brokerDown {
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			return "", fmt.Errorf("with its broker unreachable the node neither started nor stopped within 30 s")
		}
		out := logs()
		if !strings.Contains(out, "Error: connecting to") {
			return "", fmt.Errorf("the node did not get as far as connecting to its broker:%s", out)
		}
		return "", nil
	}

	// The first stdout line names the address.
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		first <- line
		io.Copy(io.Discard, stdout)
	}()
	var base string
	select {
	case line := <-first:
		m := regexp.MustCompile(`^herald listening on (http://\S+)`).FindStringSubmatch(line)
		if m == nil {
			select { // its error is on stderr once it has exited
			case <-exited:
			case <-time.After(5 * time.Second):
			}
			return "", fmt.Errorf("the node did not start with the chart's settings (first line %q):%s", line, logs())
		}
		base = m[1]
	case <-time.After(15 * time.Second):
		return "", fmt.Errorf("the node printed no address within 15 s:%s", logs())
	}

	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, string, error) {
		r, err := client.Get(base + path)
		if err != nil {
			return 0, "", err
		}
		defer r.Body.Close()
		b, err := io.ReadAll(r.Body)
		return r.StatusCode, string(b), err
	}
	for _, p := range []struct{ path, body string }{{"/health", `{"status":"ok"}`}, {"/ready", `{"status":"ready"}`}} {
		status, body, err := get(p.path)
		if err != nil || status != 200 || strings.TrimSpace(body) != p.body {
			return "", fmt.Errorf("GET %s: %d %q %v, want 200 %s", p.path, status, body, err, p.body)
		}
	}
	status, metrics, err := get("/metrics")
	if err != nil || status != 200 {
		return "", fmt.Errorf("GET /metrics: %d %v", status, err)
	}

	// SIGTERM: the node drains (no clients: at once) and exits 0.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(drainMs)*time.Millisecond+5*time.Second)
	defer cancel()
	select {
	case err := <-exited:
		if err != nil {
			return "", fmt.Errorf("after SIGTERM the node exited with %v:%s", err, logs())
		}
	case <-ctx.Done():
		return "", fmt.Errorf("the node did not exit within drain_ms + 5 s of SIGTERM")
	}
	return metrics, nil
}
