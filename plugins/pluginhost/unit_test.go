package pluginhost

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/plugins"
	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/tiers"
)

func TestDecodeGet(t *testing.T) {
	s := &Store{}
	s.spec = PluginSpec{Name: "unit"}
	res := func(codes ...storev1.ResultCode) *storev1.GetReply {
		r := &storev1.GetReply{}
		for _, c := range codes {
			r.Results = append(r.Results, &storev1.ItemResult{Code: c})
		}
		return r
	}
	miss := storev1.ResultCode_RESULT_CODE_MISS
	cases := []struct {
		name  string
		reply *storev1.GetReply
		n     int
		bad   bool
		hits  int
	}{
		{"hits and misses", res(ok, miss, ok), 3, false, 2},
		{"short", res(ok, ok), 3, true, 0},
		{"long", res(ok, ok, ok, ok), 3, true, 0},
		{"unset code", res(ok, storev1.ResultCode_RESULT_CODE_UNSPECIFIED, ok), 3, true, 0},
		{"full is still a miss", res(storev1.ResultCode_RESULT_CODE_FULL), 1, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			results := make([]error, tc.n)
			sentinel := errors.New("untouched")
			for i := range results {
				results[i] = sentinel
			}
			err := s.decodeGet(tc.reply, results)
			if (err != nil) != tc.bad {
				t.Fatalf("err = %v, bad want %v", err, tc.bad)
			}
			hits := 0
			for _, r := range results {
				switch {
				case r == nil:
					hits++
				case tc.bad && r != sentinel:
					t.Fatalf("a malformed reply changed results: %v", r)
				case !tc.bad && !errors.Is(r, tiers.ErrMiss):
					t.Fatalf("non-hit %v does not wrap ErrMiss", r)
				}
			}
			if hits != tc.hits {
				t.Fatalf("%d hits, want %d", hits, tc.hits)
			}
		})
	}
}

func TestOptions(t *testing.T) {
	d := Options{}.withDefaults()
	if d.String() != DefaultOptions().String() {
		t.Fatalf("zero options with defaults = %v, want %v", d, DefaultOptions())
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []func(*Options){
		func(o *Options) { o.CallTimeout = -1 },
		func(o *Options) { o.MaxRestartBackoff = o.RestartBackoff / 2 },
		func(o *Options) { o.BreakerFailures = -1 },
		func(o *Options) { o.AckTimeout = -time.Second },
	}
	for i, mut := range bad {
		o := d
		mut(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("case %d: %v validated", i, o)
		}
	}
	o := Options{RestartBackoff: 100 * time.Millisecond, MaxRestartBackoff: time.Second}
	for n, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if got := o.backoff(n); got != want*time.Millisecond {
			t.Errorf("backoff(%d) = %v, want %vms", n, got, want)
		}
	}
	if s := d.String(); !strings.Contains(s, "call_timeout=10s") || !strings.Contains(s, "breaker_failures=5") {
		t.Errorf("String() = %q", s)
	}
	spec := PluginSpec{Name: "x", Path: "/bin/x", SHA256: strings.Repeat("0", 64)}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, sum := range []string{"", "abc", strings.Repeat("g", 64)} {
		spec.SHA256 = sum
		if err := spec.Validate(); err == nil {
			t.Errorf("sha256 %q validated", sum)
		}
	}
}

func TestStartErrorMessages(t *testing.T) {
	spec := PluginSpec{Name: "p", Path: "/bin/p"}
	notes := &bridgeNotes{}
	cases := []struct {
		goPlugin string
		want     error
		mention  string
	}{
		{"Unrecognized remote plugin message: hello\n\nThis usually means...", ErrHandshake, `"hello" to stdout`},
		{"incompatible API version with plugin. Plugin version: 3, Client versions: [1]", ErrNoCommonVersion, "plugin speaks [3]"},
		{"timeout while waiting for plugin to start", ErrHandshake, "no handshake within"},
		{"plugin exited before we could connect", ErrHandshake, "exited before the handshake"},
	}
	for _, c := range cases {
		err := startError(spec, errors.New(c.goPlugin), notes)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%q -> %v; want %v mentioning %q", c.goPlugin, err, c.want, c.mention)
		}
	}
	notes.note(hclog.Error, plugins.NoCommonVersionMessage, []any{"host_versions", "2", "plugin_versions", "1"})
	err := startError(spec, errors.New("plugin exited before we could connect"), notes)
	if !errors.Is(err, ErrNoCommonVersion) || !strings.Contains(err.Error(), "host speaks [2], plugin speaks [1]") {
		t.Errorf("versions line -> %v", err)
	}
}

func TestConfigJSON(t *testing.T) {
	cases := []struct {
		name string
		cfg  any
		want string
		bad  bool
	}{
		{"nil", nil, "null", false},
		{"map", map[string]any{"capacity": 5}, `{"capacity":5}`, false},
		{"yaml bytes", []byte("capacity: 8GiB\nsync: true\nnested:\n  a: [1, 2]\n"), `{"capacity":"8GiB","nested":{"a":[1,2]},"sync":true}`, false},
		{"bad yaml", []byte("a: [1,\n"), "", true},
		{"unmarshalable", map[string]any{"f": func() {}}, "", true},
	}
	for _, c := range cases {
		got, err := PluginSpec{Name: "x", Config: c.cfg}.configJSON()
		if (err != nil) != c.bad || (!c.bad && string(got) != c.want) {
			t.Errorf("%s: %s %v, want %s (bad %v)", c.name, got, err, c.want, c.bad)
		}
	}
}

func TestBridgeRateLimitsPluginLines(t *testing.T) {
	var buf logBuffer
	b := newSlogBridge(slog.New(slog.NewTextHandler(&buf, nil)))
	named := b.Named("kvtier-plugin-x")
	for i := range maxLinesPerSecond + 50 {
		named.Info("line", "i", i)
	}
	b.Info("host line is not limited")
	out := buf.String()
	if got := strings.Count(out, "msg=line"); got != maxLinesPerSecond {
		t.Fatalf("%d plugin lines logged in one second, want %d", got, maxLinesPerSecond)
	}
	b.notes.mu.Lock()
	b.notes.window = b.notes.window.Add(-2 * time.Second)
	b.notes.mu.Unlock()
	named.Info("after")
	if !strings.Contains(buf.String(), "dropped=50") || !strings.Contains(buf.String(), "host line is not limited") {
		t.Fatalf("drop count or host line missing:\n%s", buf.String())
	}
}

func TestMetricsRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := newMetrics(reg, "l4", "store")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newMetrics(reg, "l4", "store"); err == nil {
		t.Fatal("a second plugin of the same name and role registered its metrics")
	}
	b, err := newMetrics(reg, "l3-index", "index")
	if err != nil {
		t.Fatal(err)
	}
	a.up.Set(1)
	b.failures.WithLabelValues(reasonTimeout).Inc()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			found[f.GetName()+"/"+labels["plugin"]+"/"+labels["role"]+"/"+labels["reason"]] = true
		}
	}
	for _, want := range []string{"kvtier_plugin_up/l4/store/", "kvtier_plugin_failures_total/l3-index/index/timeout", "kvtier_plugin_restarts_total/l4/store/"} {
		if !found[want] {
			t.Errorf("metric %s not gathered; have %v", want, found)
		}
	}
	a.unregister()
	if _, err := newMetrics(reg, "l4", "store"); err != nil {
		t.Fatalf("re-register after unregister: %v", err)
	}
}

// FuzzConfigJSON: whatever YAML a stack holds in a plugin's config block,
// re-encoding it as JSON never panics and yields valid JSON.
func FuzzConfigJSON(f *testing.F) {
	for _, s := range []string{"capacity: 8GiB\n", "a: [1, {b: c}]\n", "null", "- 1\n- 2\n", "a: &x 1\nb: *x\n", ": :"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := PluginSpec{Name: "f", Config: b}.configJSON()
		if err == nil && !json.Valid(out) {
			t.Fatalf("%q became invalid JSON %q", b, out)
		}
	})
}

// FuzzStartError: go-plugin's start errors are parsed for versions and the
// stdout line; any text must give an error that wraps one of the sentinels.
func FuzzStartError(f *testing.F) {
	for _, s := range []string{
		"Unrecognized remote plugin message: hi\nmore",
		"incompatible API version with plugin. Plugin version: 9, Client versions: [1]",
		"timeout while waiting for plugin to start",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := startError(PluginSpec{Name: "f", Path: "/p"}, errors.New(s), &bridgeNotes{})
		if !errors.Is(err, ErrHandshake) && !errors.Is(err, ErrNoCommonVersion) && !errors.Is(err, ErrChecksum) {
			t.Fatalf("%q -> %v wraps no sentinel", s, err)
		}
	})
}
