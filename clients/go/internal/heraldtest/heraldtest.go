// Package heraldtest starts a real herald node for the SDK's integration tests. The binary comes
// from HERALD_BIN, or target/debug/herald at the repository root. Every wait is bounded and the
// process is killed when the test ends, also on failure.
package heraldtest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// APIKey and Secret are the node's API key and token HMAC secret.
const (
	APIKey = "test-api-key"
	Secret = "test-token-secret-0123456789"
)

// Node is a running herald.
type Node struct {
	Port int
	cmd  *exec.Cmd
	out  *syncBuffer
}

// WS is the node's WebSocket URL.
func (n *Node) WS() string { return fmt.Sprintf("ws://127.0.0.1:%d/ws", n.Port) }

// HTTP is the node's base URL.
func (n *Node) HTTP() string { return fmt.Sprintf("http://127.0.0.1:%d", n.Port) }

// Output is what the node printed so far.
func (n *Node) Output() string { return n.out.String() }

// Binary is the herald binary to test against. With HERALD_BIN unset and the default missing,
// tests skip; with HERALD_BIN set to a missing file, they fail.
// A relative HERALD_BIN is taken from the repository root, like the default.
func Binary(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	// internal/heraldtest -> go -> clients -> repository root
	root := filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
	if b := os.Getenv("HERALD_BIN"); b != "" {
		if !filepath.IsAbs(b) {
			b = filepath.Join(root, b)
		}
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("HERALD_BIN: %v", err)
		}
		return b
	}
	b := filepath.Join(root, "target", "debug", "herald")
	if _, err := os.Stat(b); err != nil {
		t.Skipf("no herald binary at %s (build it or set HERALD_BIN)", b)
	}
	return b
}

// Start runs `herald serve --dev` on a free port with the API key, the token secret, env (KEY=VALUE)
// and, when config is not empty, that TOML as --config.
func Start(t testing.TB, config string, env ...string) *Node {
	t.Helper()
	bin := Binary(t)
	port := freePort(t)
	args := []string{"serve", "--dev", "--port", strconv.Itoa(port)}
	if config != "" {
		path := filepath.Join(t.TempDir(), "herald.toml")
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "RUST_LOG=warn", "HERALD_API_KEY="+APIKey, "HERALD_TOKEN_HMAC_SECRET="+Secret)
	cmd.Env = append(cmd.Env, env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	n := &Node{Port: port, cmd: cmd, out: out}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			t.Errorf("herald (pid %d) did not exit after SIGKILL", cmd.Process.Pid)
		}
		if t.Failed() {
			t.Logf("herald output:\n%s", out.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-exited:
			t.Fatalf("herald exited during start-up:\n%s", out.String())
		default:
		}
		if r, err := hc.Get(n.HTTP() + "/health"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("herald did not answer /health within 20 s:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
