// Package redistest starts real redis-server processes on loopback ports in
// temporary directories — one standalone server, or a Redis Cluster of
// masters and replicas created with `redis-cli --cluster create` — for the
// tests of tiers/redis, its plugin binary and `kvtier bench redis`.
//
// Every process is started with a parent-death signal and killed by Stop
// (and, through the testing.TB helpers, in t.Cleanup even when the test
// fails), so no server outlives its test. Nothing here is meant for
// production: persistence is off and protected mode is off.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ErrNoServer is returned when redis-server or redis-cli is not installed.
var ErrNoServer = errors.New("redis-server or redis-cli not found in PATH (Debian: apt-get install redis-server redis-tools)")

// Options shape the servers.
type Options struct {
	// MaxMemoryBytes, if positive, is each server's maxmemory.
	MaxMemoryBytes int64
	// Policy is the maxmemory-policy (default allkeys-lru).
	Policy string
	// NodeTimeout is cluster-node-timeout (default 1s): how long a master
	// may be silent before its replica fails over.
	NodeTimeout time.Duration
	// Dir holds one subdirectory per server; empty means a new temporary
	// directory removed by Stop.
	Dir string
	// Logf, if set, receives progress lines.
	Logf func(format string, args ...any)
}

// Binaries returns the paths of redis-server and redis-cli, or ErrNoServer.
func Binaries() (server, cli string, err error) {
	server, err1 := exec.LookPath("redis-server")
	cli, err2 := exec.LookPath("redis-cli")
	if err1 != nil || err2 != nil {
		return "", "", ErrNoServer
	}
	return server, cli, nil
}

// Node is one redis-server process.
type Node struct {
	// Port is the client port on 127.0.0.1.
	Port int
	// Dir is the server's working directory (logs, nodes.conf).
	Dir string

	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{}
}

// Addr returns "127.0.0.1:port".
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)) }

// Client returns a plain client of this node (the caller closes it).
func (n *Node) Client() *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: n.Addr(), Protocol: 2, DisableIdentity: true, MaxRetries: -1, DialTimeout: time.Second})
}

// Start starts the process (again, after Kill, with the same directory and
// config) and waits until it answers PING.
func (n *Node) Start(ctx context.Context) error {
	server, _, err := Binaries()
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("redis node %s: already running", n.Addr())
	}
	log, err := os.OpenFile(filepath.Join(n.Dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redis node %s: %w", n.Addr(), err)
	}
	cmd := exec.Command(server, n.args...)
	cmd.Dir = n.Dir
	cmd.Stdout, cmd.Stderr = log, log
	// NB: the server dies with the test process even if Stop never runs
	// (a test binary killed by its -timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("redis node %s: start %s: %w", n.Addr(), server, err)
	}
	exit := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(exit)
	}()
	n.cmd, n.exit = cmd, exit
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(n.Addr()); err == nil {
			return nil
		}
		select {
		case <-exit:
			n.cmd = nil
			return fmt.Errorf("redis node %s exited at start; log:\n%s", n.Addr(), tail(filepath.Join(n.Dir, "redis.log")))
		case <-ctx.Done():
			return fmt.Errorf("redis node %s: %w", n.Addr(), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis node %s: no PING answer after 10s; log:\n%s", n.Addr(), tail(filepath.Join(n.Dir, "redis.log")))
		}
	}
}

// Kill sends SIGKILL and waits for the process to exit. Killing a node
// that is not running does nothing.
func (n *Node) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exit
	n.cmd = nil
}

// Running reports whether the process is up (as far as Kill knows).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// ping does a raw RESP PING: the node answers +PONG (or -LOADING) once up.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("ping %s: %q", addr, strings.TrimSpace(line))
	}
	return nil
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// freePorts returns n distinct ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (o Options) withDefaults() Options {
	if o.Policy == "" {
		o.Policy = "allkeys-lru"
	}
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = time.Second
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// newNode prepares (does not start) a node in dir/name.
func newNode(o Options, root, name string, port, busPort int) (*Node, error) {
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("redis node dir: %w", err)
	}
	args := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no",
		"--logfile", filepath.Join(dir, "redis.log"), "--maxmemory-policy", o.Policy,
	}
	if o.MaxMemoryBytes > 0 {
		args = append(args, "--maxmemory", strconv.FormatInt(o.MaxMemoryBytes, 10))
	}
	if busPort > 0 {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10),
			"--cluster-port", strconv.Itoa(busPort),
			// A master whose replica is away still serves its slots, and
			// a cluster with one master down still serves the others.
			"--cluster-require-full-coverage", "no", "--cluster-allow-reads-when-down", "no",
			"--cluster-replica-validity-factor", "0")
	}
	return &Node{Port: port, Dir: dir, args: args}, nil
}

// Standalone is one standalone server.
type Standalone struct {
	*Node
	root, ownDir string
}

// StartStandalone starts one standalone server.
func StartStandalone(ctx context.Context, o Options) (*Standalone, error) {
	if _, _, err := Binaries(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	root, own, err := rootDir(o)
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		n, err := newNode(o, root, fmt.Sprintf("standalone-%d", ports[0]), ports[0], 0)
		if err != nil {
			return nil, err
		}
		if lastErr = n.Start(ctx); lastErr == nil {
			o.Logf("redistest: standalone redis-server on %s", n.Addr())
			return &Standalone{Node: n, root: root, ownDir: own}, nil
		}
	}
	if own != "" {
		os.RemoveAll(own)
	}
	return nil, lastErr
}

// Stop kills the server and removes its temporary directory.
func (s *Standalone) Stop() {
	s.Kill()
	if s.ownDir != "" {
		os.RemoveAll(s.ownDir)
	}
}

func rootDir(o Options) (root, own string, err error) {
	if o.Dir != "" {
		return o.Dir, "", nil
	}
	d, err := os.MkdirTemp("", "kvtier-redis-")
	if err != nil {
		return "", "", fmt.Errorf("redis test dir: %w", err)
	}
	return d, d, nil
}

// Cluster is a Redis Cluster of masters, each with replicas.
type Cluster struct {
	// Nodes lists every node, masters first as created (a failover
	// changes who is master: ask Masters).
	Nodes  []*Node
	ownDir string
	o      Options
}

// StartCluster starts masters*(1+replicasPer) nodes and joins them with
// `redis-cli --cluster create`, then waits until every node reports the
// cluster ok and every replica is in sync.
func StartCluster(ctx context.Context, masters, replicasPer int, o Options) (*Cluster, error) {
	_, cli, err := Binaries()
	if err != nil {
		return nil, err
	}
	o = o.withDefaults()
	root, own, err := rootDir(o)
	if err != nil {
		return nil, err
	}
	c := &Cluster{ownDir: own, o: o}
	total := masters * (1 + replicasPer)
	ports, err := freePorts(2 * total)
	if err != nil {
		c.Stop()
		return nil, err
	}
	for i := range total {
		n, err := newNode(o, root, fmt.Sprintf("node-%d", ports[i]), ports[i], ports[total+i])
		if err != nil {
			c.Stop()
			return nil, err
		}
		if err := n.Start(ctx); err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPer), "--cluster-yes")
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, cli, args...).CombinedOutput()
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	o.Logf("redistest: cluster of %d masters x %d replicas on %v", masters, replicasPer, c.Addrs())
	return c, nil
}

// Addrs returns every node's address.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// Stop kills every node and removes the temporary directory.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		n.Kill()
	}
	if c.ownDir != "" {
		os.RemoveAll(c.ownDir)
	}
}

// NodeByAddr returns the node listening on addr, or nil.
func (c *Cluster) NodeByAddr(addr string) *Node {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Role returns "master" or "slave" as the running node says, with the
// master's port for a replica.
func Role(ctx context.Context, n *Node) (role string, masterPort int, err error) {
	cl := n.Client()
	defer cl.Close()
	v, err := cl.Do(ctx, "role").Slice()
	if err != nil {
		return "", 0, fmt.Errorf("role of %s: %w", n.Addr(), err)
	}
	if len(v) == 0 {
		return "", 0, fmt.Errorf("role of %s: empty reply", n.Addr())
	}
	role, _ = v[0].(string)
	if role == "slave" && len(v) > 2 {
		switch p := v[2].(type) {
		case int64:
			masterPort = int(p)
		case int:
			masterPort = p
		case string:
			masterPort, _ = strconv.Atoi(p)
		}
	}
	return role, masterPort, nil
}

// Masters returns the running nodes that are masters now.
func (c *Cluster) Masters(ctx context.Context) []*Node {
	var out []*Node
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		if r, _, err := Role(ctx, n); err == nil && r == "master" {
			out = append(out, n)
		}
	}
	return out
}

// ReplicaOf returns a running replica of master m, or nil.
func (c *Cluster) ReplicaOf(ctx context.Context, m *Node) *Node {
	for _, n := range c.Nodes {
		if !n.Running() || n == m {
			continue
		}
		if r, port, err := Role(ctx, n); err == nil && r == "slave" && port == m.Port {
			return n
		}
	}
	return nil
}

// WaitHealthy waits until every running node says cluster_state:ok and
// every running replica's link to its master is up.
func (c *Cluster) WaitHealthy(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last string
	for {
		last = c.unhealthy(ctx)
		if last == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster not healthy after %v: %s", within, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unhealthy returns why the cluster is not healthy, or "".
func (c *Cluster) unhealthy(ctx context.Context) string {
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		cl := n.Client()
		info, err := cl.ClusterInfo(ctx).Result()
		if err == nil && !strings.Contains(info, "cluster_state:ok") {
			err = errors.New("cluster_state not ok")
		}
		var repl string
		if err == nil {
			repl, err = cl.Info(ctx, "replication").Result()
		}
		cl.Close()
		if err != nil {
			return fmt.Sprintf("%s: %v", n.Addr(), err)
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return n.Addr() + ": replica link down"
		}
	}
	return ""
}

// Failover makes replica r take over from its master (CLUSTER FAILOVER,
// a coordinated handover with no lost writes) and waits until it is master.
func (c *Cluster) Failover(ctx context.Context, r *Node, within time.Duration) error {
	cl := r.Client()
	defer cl.Close()
	if err := cl.Do(ctx, "cluster", "failover").Err(); err != nil {
		return fmt.Errorf("cluster failover on %s: %w", r.Addr(), err)
	}
	return waitRole(ctx, r, "master", within)
}

// WaitMaster waits until node n says it is a master.
func WaitMaster(ctx context.Context, n *Node, within time.Duration) error {
	return waitRole(ctx, n, "master", within)
}

func waitRole(ctx context.Context, n *Node, want string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		r, _, err := Role(ctx, n)
		if err == nil && r == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is %q (%v), not %s, after %v", n.Addr(), r, err, want, within)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// RequireBinaries skips tb with a clear message when redis-server or
// redis-cli is absent.
func RequireBinaries(tb testing.TB) {
	tb.Helper()
	if _, _, err := Binaries(); err != nil {
		tb.Skipf("skipping: %v", err)
	}
}

// StandaloneT starts a standalone server for a test, skips when redis is
// not installed and stops the server in tb.Cleanup.
func StandaloneT(tb testing.TB, o Options) *Standalone {
	tb.Helper()
	RequireBinaries(tb)
	if o.Dir == "" {
		o.Dir = tb.TempDir()
	}
	if o.Logf == nil {
		o.Logf = tb.Logf
	}
	s, err := StartStandalone(context.Background(), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// ClusterT starts a cluster for a test, skips when redis is not installed
// and stops every node in tb.Cleanup.
func ClusterT(tb testing.TB, masters, replicasPer int, o Options) *Cluster {
	tb.Helper()
	RequireBinaries(tb)
	if o.Dir == "" {
		o.Dir = tb.TempDir()
	}
	if o.Logf == nil {
		o.Logf = tb.Logf
	}
	c, err := StartCluster(context.Background(), masters, replicasPer, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}
