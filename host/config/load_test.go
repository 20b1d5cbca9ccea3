package config

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

const validFull = `version: 1
model:
  page_tokens: 512
  payloads:
    - {name: kv, page_bytes: 2.75MiB}
    - name: index
      page_bytes: 64KiB
tiers:
  - name: l1
    role: pool
    use: testpool
    config: {pages: 4096}
  - name: l2
    role: slab
    use: testslab
    config:
      path: /dev/hugepages/kvtier
      size: 1.5GB
      fallback: shm
  - name: l3
    role: store
    use: teststore
    index: {use: testindex, config: {map_size: 64GiB}}
    config:
      dir: /mnt/nvme0/kvtier
      align: 4KiB
      disks: [/mnt/a, /mnt/b]
  - name: remote
    role: store
    plugin:
      path: ./bin/plugins/kvtier-plugin-redis
      sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789ABCDEF
      config:
        addr: 127.0.0.1:6379
        pool: {size: 8, timeout: 2s}
  - name: cold
    role: store
    use: nocfg
policy:
  evictor: slru
  params: {protected_share: 0.8}
  planner: greedy
write_policy: write_back
ranks: {world_size: 4, rank: 3}
metrics: {listen: "0.0.0.0:9500"}
api: {listen: ""}
`

func TestLoadFull(t *testing.T) {
	s, err := Load([]byte(validFull), "full.yaml", testModules())
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	wantGeom := tiers.PayloadGeometry{PageTokens: 512, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 2883584}, {Name: "index", PageBytes: 65536}}}
	if !reflect.DeepEqual(s.Payload, wantGeom) {
		t.Errorf("geometry %+v, want %+v", s.Payload, wantGeom)
	}
	if len(s.Tiers) != 5 {
		t.Fatalf("%d tiers, want 5", len(s.Tiers))
	}
	if got, want := s.Tiers[0].Config, (&testPoolConfig{Pages: 4096}); !reflect.DeepEqual(got, want) {
		t.Errorf("pool config %+v, want %+v (device defaulted to 0)", got, want)
	}
	if got, want := s.Tiers[1].Config, (&testSlabConfig{Path: "/dev/hugepages/kvtier", Size: 1500000000, Fallback: "shm"}); !reflect.DeepEqual(got, want) {
		t.Errorf("slab config %+v, want %+v", got, want)
	}
	if got, want := s.Tiers[2].Config, (&testStoreConfig{Dir: "/mnt/nvme0/kvtier", Budget: quantity.TiB, Align: 4 * quantity.KiB, Disks: []string{"/mnt/a", "/mnt/b"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("store config %+v, want %+v (budget defaulted)", got, want)
	}
	if got, want := s.Tiers[2].Index, (&IndexSpec{Use: "testindex", Config: &testIndexConfig{MapSize: 64 * quantity.GiB, Sync: true}}); !reflect.DeepEqual(got, want) {
		t.Errorf("index %+v, want %+v", got, want)
	}
	pl := s.Tiers[3].Plugin
	if pl == nil || pl.Path != "./bin/plugins/kvtier-plugin-redis" || s.Tiers[3].Use != "" || s.Tiers[3].Config != nil {
		t.Fatalf("plugin tier %+v", s.Tiers[3])
	}
	if want := "addr: 127.0.0.1:6379\npool:\n  size: 8\n  timeout: 2s\n"; string(pl.Config) != want {
		t.Errorf("plugin config %q, want %q", pl.Config, want)
	}
	if s.Tiers[4].Config != nil {
		t.Errorf("config-less module got config %#v", s.Tiers[4].Config)
	}
	wantRest := Stack{
		Policy:      Policy{Evictor: "slru", Params: map[string]float64{"protected_share": 0.8}, Planner: PlannerGreedy},
		WritePolicy: WriteBack,
		Ranks:       Ranks{WorldSize: 4, Rank: 3},
		Metrics:     Endpoint{Listen: "0.0.0.0:9500"},
		API:         Endpoint{Listen: ""},
	}
	if !reflect.DeepEqual(s.Policy, wantRest.Policy) || s.WritePolicy != wantRest.WritePolicy || s.Ranks != wantRest.Ranks || s.Metrics != wantRest.Metrics || s.API != wantRest.API {
		t.Errorf("got %+v", s)
	}
	if err := s.Validate(); err != nil {
		t.Errorf("Validate of a loaded stack: %v", err)
	}
}

// TestRoundTrip checks that String prints YAML that loads to an equal
// Stack, and that printing is a fixed point.
func TestRoundTrip(t *testing.T) {
	m := testModules()
	for _, tc := range []struct{ name, yaml string }{
		{"full", validFull},
		{"minimal", "version: 1\nmodel: {page_tokens: 16, payloads: [{name: kv, page_bytes: 1000}]}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s1, err := Load([]byte(tc.yaml), tc.name, m)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			out := s1.String()
			s2, err := Load([]byte(out), tc.name+".out", m)
			if err != nil {
				t.Fatalf("Load of String():\n%s\nerror: %v", out, err)
			}
			if !equalStacks(s1, s2) {
				t.Fatalf("round trip changed the stack:\n%+v\n%+v\nYAML:\n%s", s1, s2, out)
			}
			if out2 := s2.String(); out2 != out {
				t.Fatalf("String is not a fixed point:\n%s\n---\n%s", out, out2)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	s, err := Load([]byte("version: 1\nmodel: {page_tokens: 512, payloads: [{name: kv, page_bytes: 2MiB}]}\n"), "min.yaml", testModules())
	if err != nil {
		t.Fatal(err)
	}
	want := &Stack{
		Version:     1,
		Payload:     tiers.PayloadGeometry{PageTokens: 512, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 2 << 20}}},
		Tiers:       []Tier{},
		Policy:      Policy{Evictor: DefaultEvictor, Params: map[string]float64{}, Planner: DefaultPlanner},
		WritePolicy: DefaultWritePolicy,
		Ranks:       Ranks{WorldSize: 1, Rank: 0},
		Metrics:     Endpoint{Listen: DefaultMetricsListen},
		API:         Endpoint{Listen: DefaultAPIListen},
	}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("got  %+v\nwant %+v", s, want)
	}
}

func TestDefaultYAMLIsACopy(t *testing.T) {
	b := DefaultYAML()
	b[0] = 'X'
	if DefaultYAML()[0] == 'X' {
		t.Error("DefaultYAML exposes the embedded bytes")
	}
}

// TestLoadErrors is the table of error classes: each case marks the line
// the error must point at with "#<" and gives the YAML path and a part of
// the message. Every message must read FILE:LINE:COL: PATH: ... and show
// the source line.
func TestLoadErrors(t *testing.T) {
	const model = "model: {page_tokens: 512, payloads: [{name: kv, page_bytes: 2MiB}]}\n"
	const slab = "  - {name: l2, role: slab, use: testslab}\n"
	tests := []struct {
		name, yaml, path, msg string
		is                    error
	}{
		// Syntax.
		{name: "syntax", yaml: "version: 1\nmodel: {page_tokens: 512 #<\n", path: "", msg: "could not find flow mapping end token"},
		{name: "tab indentation", yaml: "version: 1\nmodel:\n\tpage_tokens: 512 #<\n", path: "", msg: "cannot start any token"},
		{name: "tag without value", yaml: "version: 1\n" + model + "tiers: !x #<\n", path: "$.tiers", msg: "tag !x has no value"},
		{name: "duplicate key", yaml: "version: 1\n" + model + "version: 1 #<\n", path: "", msg: "already defined"},
		// Unknown fields.
		{name: "unknown top-level field", yaml: "version: 1\n" + model + "tier: [] #<\n", path: "$.tier", msg: `unknown field "tier" (known: version, model, tiers, policy, write_policy, ranks, metrics, api)`},
		{name: "unknown model field", yaml: "version: 1\nmodel:\n  page_token: 512 #<\n", path: "$.model.page_token", msg: `unknown field "page_token" (known: page_tokens, payloads)`},
		{name: "unknown payload field", yaml: "version: 1\nmodel:\n  page_tokens: 512\n  payloads:\n    - {name: kv, bytes: 1} #<\n", path: "$.model.payloads[0].bytes", msg: `(known: name, page_bytes)`},
		{name: "unknown module field", yaml: "version: 1\n" + model + "tiers:\n  - name: l2\n    role: slab\n    use: testslab\n    config:\n      sise: 1GiB #<\n", path: "$.tiers[0].config.sise", msg: `unknown field "sise" (known: path, size, fallback) (config of kvtier.tier.slab.v1/testslab)`},
		{name: "unknown index field", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - name: l3\n    role: store\n    use: teststore\n    index:\n      use: testindex\n      config: {mapsize: 1} #<\n", path: "$.tiers[1].index.config.mapsize", msg: `(known: map_size, sync) (config of kvtier.index.v1/testindex)`},
		{name: "unknown policy field", yaml: "version: 1\n" + model + "policy:\n  evicter: lru #<\n", path: "$.policy.evicter", msg: `(known: evictor, params, planner, shadow)`},
		// Wrong types.
		{name: "version is a string", yaml: "version: one #<\n" + model, path: "$.version", msg: `want an integer, got the string "one"`},
		{name: "page_tokens is a float", yaml: "version: 1\nmodel:\n  page_tokens: 512.5 #<\n  payloads: [{name: kv, page_bytes: 2MiB}]\n", path: "$.model.page_tokens", msg: "want an integer, got float 512.5"},
		{name: "integer too large", yaml: "version: 1\n" + model + "ranks: {world_size: 99999999999999999999} #<\n", path: "$.ranks.world_size", msg: "99999999999999999999 is out of range"},
		{name: "quoted integer", yaml: "version: 1\n" + model + "ranks: {world_size: \"2\"} #<\n", path: "$.ranks.world_size", msg: `want an integer, got the string "2"`},
		{name: "tiers is a mapping", yaml: "version: 1\n" + model + "tiers:\n  l2: {role: slab} #<\n", path: "$.tiers", msg: "want a list, got a mapping"},
		{name: "module field wrong type", yaml: "version: 1\n" + model + "tiers:\n  - name: l2\n    role: slab\n    use: testslab\n    config:\n      path: [a, b] #<\n", path: "$.tiers[0].config.path", msg: "want a string, got a list"},
		{name: "module int field is a string", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - name: l1x\n    role: store\n    use: teststore\n    config: {disks: 3} #<\n", path: "$.tiers[1].config.disks", msg: "want a list"},
		{name: "params value not a number", yaml: "version: 1\n" + model + "policy:\n  evictor: slru\n  params: {protected_share: high} #<\n", path: "$.policy.params.protected_share", msg: "want a number"},
		{name: "size is a list", yaml: "version: 1\nmodel:\n  page_tokens: 512\n  payloads:\n    - name: kv\n      page_bytes: [1] #<\n", path: "$.model.payloads[0].page_bytes", msg: "want a size such as 4096, 2MiB or 2.75MiB, got a list"},
		// Missing required values.
		{name: "empty", yaml: "", path: "$", msg: "config is empty"},
		{name: "not a mapping", yaml: "- version: 1 #<\n", path: "$", msg: "want a mapping at the top level"},
		{name: "two documents", yaml: "version: 1\n" + model + "---\nversion: 1 #<\n", path: "$", msg: "more than one YAML document"},
		{name: "missing version", yaml: "# no version\n" + strings.TrimSuffix(model, "\n") + " #<\n", path: "$.version", msg: "missing required field: the schema version"},
		{name: "null version", yaml: "version: #<\n" + model, path: "$.version", msg: "missing required field"},
		{name: "missing page_tokens", yaml: "version: 1\nmodel: #<\n  payloads: [{name: kv, page_bytes: 2MiB}]\n", path: "$.model.page_tokens", msg: "missing required field: tokens per page"},
		{name: "missing page_bytes", yaml: "version: 1\nmodel:\n  page_tokens: 512\n  payloads:\n    - name: kv #<\n", path: "$.model.payloads[0].page_bytes", msg: "missing required field: the payload's bytes per page"},
		{name: "missing tier role", yaml: "version: 1\n" + model + "tiers:\n  - name: l2 #<\n    use: testslab\n", path: "$.tiers[0].role", msg: "missing required field: the tier's role"},
		{name: "missing use and plugin", yaml: "version: 1\n" + model + "tiers:\n  - name: l2 #<\n    role: slab\n", path: "$.tiers[0].use", msg: "set use (a registered module name) or plugin"},
		{name: "missing plugin sha", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - name: r\n    role: store\n    plugin: #<\n      path: ./p\n", path: "$.tiers[1].plugin.sha256", msg: "missing required field: the plugin binary's SHA-256"},
		// Impossible values and sizes.
		{name: "version 2", yaml: "version: 2 #<\n" + model, path: "$.version", msg: "unsupported version 2 (this kvtier reads version 1)"},
		{name: "version 2 with new fields", yaml: "version: 2 #<\n" + model + "placement: {spread: true}\n", path: "$.version", msg: "unsupported version 2 (this kvtier reads version 1)"},
		{name: "page_tokens zero", yaml: "version: 1\nmodel:\n  page_tokens: 0 #<\n  payloads: [{name: kv, page_bytes: 2MiB}]\n", path: "$.model.page_tokens", msg: "must be in [1, 1048576], got 0"},
		{name: "no payloads", yaml: "version: 1\nmodel:\n  page_tokens: 512\n  payloads: [] #<\n", path: "$.model.payloads", msg: "at least one payload kind"},
		{name: "page_bytes zero", yaml: "version: 1\nmodel:\n  page_tokens: 512\n  payloads:\n    - name: kv\n      page_bytes: 0 #<\n", path: "$.model.payloads[0].page_bytes", msg: "must be positive, got 0 bytes"},
		{name: "page_bytes negative", yaml: "version: 1\nmodel:\n  page_tokens: 512\n  payloads:\n    - name: kv\n      page_bytes: -2MiB #<\n", path: "$.model.payloads[0].page_bytes", msg: `size "-2MiB": must not be negative`},
		{name: "page_bytes fraction of a byte", yaml: "version: 1\nmodel:\n  page_tokens: 512\n  payloads:\n    - name: kv\n      page_bytes: 0.1KiB #<\n", path: "$.model.payloads[0].page_bytes", msg: "not a whole number"},
		{name: "page_bytes unknown unit", yaml: "version: 1\nmodel:\n  page_tokens: 512\n  payloads:\n    - name: kv\n      page_bytes: 2M #<\n", path: "$.model.payloads[0].page_bytes", msg: `unknown unit "M"`},
		{name: "module size bad", yaml: "version: 1\n" + model + "tiers:\n  - name: l2\n    role: slab\n    use: testslab\n    config:\n      size: 64 gigs #<\n", path: "$.tiers[0].config.size", msg: `unknown unit "gigs"`},
		{name: "page_bytes not a multiple of module alignment", yaml: "version: 1\nmodel: {page_tokens: 512, payloads: [{name: kv, page_bytes: 1000}]}\ntiers:\n" + slab + "  - name: l3\n    role: store\n    use: teststore\n    config: {align: 4KiB} #<\n", path: "$.tiers[1].config", msg: "page_bytes 1000 is not a multiple of align 4096"},
		{name: "module Validate", yaml: "version: 1\n" + model + "tiers:\n  - name: l2\n    role: slab\n    use: testslab\n    config: {fallback: tmpfs} #<\n", path: "$.tiers[0].config", msg: `fallback "tmpfs": want none or shm`},
		{name: "duplicate payload", yaml: "version: 1\nmodel:\n  page_tokens: 512\n  payloads:\n    - {name: kv, page_bytes: 1}\n    - {name: kv, page_bytes: 1} #<\n", path: "$.model.payloads[1].name", msg: `payload "kv" is already defined at $.model.payloads[0]`},
		// Unknown names.
		{name: "unknown tier module", yaml: "version: 1\n" + model + "tiers:\n  - name: l2\n    role: slab\n    use: l2hugetlb #<\n", path: "$.tiers[0].use", msg: `no slab module named "l2hugetlb" is registered (known: testslab)`, is: registry.ErrNotFound},
		{name: "module of another role", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - name: l3\n    role: store\n    use: testslab #<\n", path: "$.tiers[1].use", msg: `no store module named "testslab" is registered (known: nocfg, teststore)`, is: registry.ErrNotFound},
		{name: "unknown index module", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - name: l3\n    role: store\n    use: teststore\n    index: {use: lmdb} #<\n", path: "$.tiers[1].index.use", msg: `no index module named "lmdb" is registered (known: testindex)`, is: registry.ErrNotFound},
		{name: "unknown policy", yaml: "version: 1\n" + model + "policy:\n  evictor: arc #<\n", path: "$.policy.evictor", msg: `no eviction policy named "arc" is registered (known: adaptive, belady, lru, slru)`, is: registry.ErrNotFound},
		{name: "unknown policy param", yaml: "version: 1\n" + model + "policy:\n  evictor: lru\n  params: {protected_share: 0.5} #<\n", path: "$.policy.params", msg: `unknown parameter "protected_share"`},
		{name: "bad policy param value", yaml: "version: 1\n" + model + "policy:\n  evictor: slru\n  params: {protected_share: 1.5} #<\n", path: "$.policy.params", msg: `protected_share 1.5 not in (0, 1)`},
		{name: "offline policy", yaml: "version: 1\n" + model + "policy:\n  evictor: belady #<\n", path: "$.policy.evictor", msg: "offline oracle"},
		{name: "unknown planner", yaml: "version: 1\n" + model + "policy:\n  planner: fast #<\n", path: "$.policy.planner", msg: `unknown planner "fast" (known: heap, greedy)`},
		{name: "unknown write policy", yaml: "version: 1\n" + model + "write_policy: write_around #<\n", path: "$.write_policy", msg: `unknown write policy "write_around" (known: write_through, write_through_selective, write_back)`},
		{name: "unknown role", yaml: "version: 1\n" + model + "tiers:\n  - name: l2\n    role: cache #<\n    use: testslab\n", path: "$.tiers[0].role", msg: `unknown role "cache" (known: pool, slab, store)`},
		// Tier structure.
		{name: "duplicate tier name", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - {name: l3, role: store, use: nocfg}\n  - {name: l3, role: store, use: nocfg} #<\n", path: "$.tiers[2].name", msg: `tier name "l3" is already used by $.tiers[1]`},
		{name: "bad tier name", yaml: "version: 1\n" + model + "tiers:\n  - {name: 'my tier', role: slab, use: testslab} #<\n", path: "$.tiers[0].name", msg: `tier name "my tier" must start`},
		{name: "store above slab", yaml: "version: 1\n" + model + "tiers:\n  - {name: l3, role: store, use: nocfg}\n  - {name: l2, role: slab, use: testslab} #<\n", path: "$.tiers[1].role", msg: "a slab tier cannot come after a store tier"},
		{name: "two slabs", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - {name: l2b, role: slab, use: testslab} #<\n", path: "$.tiers[1].role", msg: `at most one slab tier; "l2b" is the second`},
		{name: "store without slab", yaml: "version: 1\n" + model + "tiers:\n  - {name: l3, role: store, use: nocfg} #<\n", path: "$.tiers[0].role", msg: `store tier "l3" needs a slab tier`},
		{name: "use and plugin", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - name: l3 #<\n    role: store\n    use: nocfg\n    plugin: {path: ./p, sha256: 0000000000000000000000000000000000000000000000000000000000000000}\n", path: "$.tiers[1]", msg: "set either use (an in-process module) or plugin (a binary), not both"},
		{name: "bad sha256", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - name: r\n    role: store\n    plugin: {path: ./p, sha256: abc} #<\n", path: "$.tiers[1].plugin.sha256", msg: `want the binary's SHA-256 as 64 hex digits (sha256sum ./p), got "abc"`},
		{name: "plugin config at tier level", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - name: r\n    role: store\n    plugin: {path: ./p, sha256: 0000000000000000000000000000000000000000000000000000000000000000}\n    config: {a: 1} #<\n", path: "$.tiers[1].config", msg: "goes under plugin.config"},
		{name: "index on a slab", yaml: "version: 1\n" + model + "tiers:\n  - name: l2\n    role: slab\n    use: testslab\n    index: {use: testindex} #<\n", path: "$.tiers[0].index", msg: `only store tiers take an index; "l2" is a slab`},
		{name: "config for config-less module", yaml: "version: 1\n" + model + "tiers:\n" + slab + "  - name: l3\n    role: store\n    use: nocfg\n    config: {dir: /x} #<\n", path: "$.tiers[1].config", msg: "module kvtier.tier.store.v1/nocfg takes no config"},
		// Ranks and endpoints.
		{name: "rank out of range", yaml: "version: 1\n" + model + "ranks: {world_size: 2, rank: 2} #<\n", path: "$.ranks.rank", msg: "must be in [0, 2) for world_size 2, got 2"},
		{name: "world size zero", yaml: "version: 1\n" + model + "ranks:\n  world_size: 0 #<\n", path: "$.ranks.world_size", msg: "must be at least 1, got 0"},
		{name: "bad listen", yaml: "version: 1\n" + model + "metrics: {listen: localhost} #<\n", path: "$.metrics.listen", msg: `want host:port (e.g. 127.0.0.1:9400), got "localhost"`},
		{name: "same listen twice", yaml: "version: 1\n" + model + "metrics: {listen: ':9400'}\napi: {listen: ':9400'} #<\n", path: "$.api.listen", msg: "also the metrics address"},
	}
	m := testModules()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]byte(tc.yaml), "t.yaml", m)
			if err == nil {
				t.Fatalf("Load succeeded, want an error at %s", tc.path)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error does not wrap %v: %v", tc.is, err)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error is %T, want *Error: %v", err, err)
			}
			if ce.Path != tc.path {
				t.Errorf("path %q, want %q\n%v", ce.Path, tc.path, err)
			}
			if !strings.Contains(ce.Msg, tc.msg) {
				t.Errorf("message %q does not contain %q", ce.Msg, tc.msg)
			}
			line := markedLine(tc.yaml)
			if line == 0 {
				if ce.Line != 0 {
					t.Errorf("error has line %d, want none:\n%v", ce.Line, err)
				}
				return
			}
			if ce.Line != line {
				t.Errorf("line %d, want %d:\n%v", ce.Line, line, err)
			}
			msg := err.Error()
			prefix := "t.yaml:" + itoa(line) + ":"
			if !strings.HasPrefix(msg, prefix) {
				t.Errorf("message does not start with %q:\n%s", prefix, msg)
			}
			if tc.path != "" && !strings.Contains(msg, tc.path+": ") {
				t.Errorf("message does not name the path %s:\n%s", tc.path, msg)
			}
			if !strings.Contains(msg, ">"+pad(line)+" | ") {
				t.Errorf("message does not show source line %d:\n%s", line, msg)
			}
		})
	}
}

// markedLine returns the 1-based number of the line holding "#<", or 0.
func markedLine(s string) int {
	for i, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "#<") {
			return i + 1
		}
	}
	return 0
}

func itoa(n int) string { return strings.TrimSpace(pad(n)) }

// pad formats a line number as goccy/go-yaml's source excerpt does.
func pad(n int) string {
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	for len(s) < 3 {
		s = " " + s
	}
	return s
}

func TestValidateBuiltStack(t *testing.T) {
	good := func() *Stack {
		return &Stack{
			Version: 1,
			Payload: tiers.PayloadGeometry{PageTokens: 512, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 1 << 20}}},
			Tiers: []Tier{
				{Name: "l2", Role: RoleSlab, Use: "x", Config: &testSlabConfig{Fallback: "shm"}},
				{Name: "l3", Role: RoleStore, Use: "y", Config: &testStoreConfig{Align: 4 * quantity.KiB}},
			},
			Policy:      Policy{Evictor: "lru", Planner: PlannerHeap},
			WritePolicy: WriteThrough,
			Ranks:       Ranks{WorldSize: 1},
		}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("Validate of a good stack: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*Stack)
		path   string
	}{
		{"zero page bytes", func(s *Stack) { s.Payload.Kinds[0].PageBytes = 0 }, "$.model.payloads[0].page_bytes"},
		{"module geometry", func(s *Stack) { s.Payload.Kinds[0].PageBytes = 1000 }, "$.tiers[1].config"},
		{"module validate", func(s *Stack) { s.Tiers[0].Config = &testSlabConfig{} }, "$.tiers[0].config"},
		{"no module", func(s *Stack) { s.Tiers[1].Use = "" }, "$.tiers[1].use"},
		{"empty evictor", func(s *Stack) { s.Policy.Evictor = "" }, "$.policy.evictor"},
		{"negative rank", func(s *Stack) { s.Ranks.Rank = -1 }, "$.ranks.rank"},
		{"role order", func(s *Stack) { s.Tiers[0], s.Tiers[1] = s.Tiers[1], s.Tiers[0] }, "$.tiers[1].role"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.mutate(s)
			err := s.Validate()
			var ce *Error
			if !errors.As(err, &ce) || ce.Path != tc.path {
				t.Fatalf("got %v, want an *Error at %s", err, tc.path)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid")
			}
		})
	}
}

func TestLoadFileMissing(t *testing.T) {
	_, err := LoadFile(t.TempDir()+"/nope.yaml", testModules())
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") || errors.Is(err, ErrInvalid) {
		t.Fatalf("got %v, want a read error naming the file", err)
	}
}

// TestShadowList loads policy.shadow and refuses each bad entry by its
// path: an unknown name, a repeat, an offline policy, too many.
func TestShadowList(t *testing.T) {
	model := "model: {page_tokens: 16, payloads: [{name: kv, page_bytes: 16KiB}]}\n"
	tests := []struct {
		name, shadow, path, msg string
	}{
		{"three", "[slru, adaptive, lru]", "", ""},
		{"unknown", "[slru, nope]", "$.policy.shadow[1]", `no eviction policy named "nope"`},
		{"twice", "[lru, lru]", "$.policy.shadow[1]", "named twice"},
		{"offline", "[belady]", "$.policy.shadow[0]", "cannot run as a shadow"},
		{"too many", "[a, b, c, d, e, f, g, h, i]", "$.policy.shadow[8]", "at most 8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, err := Load([]byte("version: 1\n"+model+"policy: {evictor: lru, shadow: "+tc.shadow+"}\n"), "shadow.yaml", testModules())
			if tc.path == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(st.Policy.Shadow, []string{"slru", "adaptive", "lru"}) {
					t.Fatalf("shadow %v", st.Policy.Shadow)
				}
				return
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Path != tc.path || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want at %s: %q", err, tc.path, tc.msg)
			}
		})
	}
}
