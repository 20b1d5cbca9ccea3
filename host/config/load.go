package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultYAML returns a copy of the embedded default stack config.
func DefaultYAML() []byte { return append([]byte(nil), defaultYAML...) }

// Modules are the registries a config's module names are checked against
// and whose registrations decode the modules' configs. A nil registry is
// treated as empty.
type Modules struct {
	// Tiers holds the tier modules.
	Tiers *tiers.Registry
	// Indexes holds the index modules.
	Indexes *indexes.Registry
	// Policies holds the eviction policies.
	Policies *policy.Registry
}

// Default loads the embedded default stack with the modules m.
func Default(m Modules) (*Stack, error) {
	return Load(defaultYAML, "default.yaml", m)
}

// LoadFile reads and loads the config at path. It reads at most
// MaxConfigBytes: a larger file (or a device such as /dev/zero) is refused
// with an *Error naming the file and the limit.
func LoadFile(path string, m Modules) (*Stack, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Load(data, path, m)
}

// ReadFile reads the stack config file at path as LoadFile does, refusing
// one larger than MaxConfigBytes, for a caller that rewrites its text
// before Load (serve's placeholders).
func ReadFile(path string) ([]byte, error) { return readCapped(path, MaxConfigBytes) }

// readCapped reads the file at path, refusing one of more than limit
// bytes after reading limit+1 of them.
func readCapped(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read stack config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read stack config %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, &Error{File: path, Msg: fmt.Sprintf("config is larger than the %s a stack config may hold", quantity.Size(limit))}
	}
	return data, nil
}

// Load parses data (named name in errors), decodes it strictly — every
// module's config into the struct its registration provides — applies
// defaults and validates the result. Every content error is an *Error
// wrapping ErrInvalid, with the file, line, YAML path and source excerpt.
func Load(data []byte, name string, m Modules) (*Stack, error) {
	if m.Tiers == nil {
		m.Tiers = tiers.NewRegistry()
	}
	if m.Indexes == nil {
		m.Indexes = indexes.NewRegistry()
	}
	if m.Policies == nil {
		m.Policies = policy.NewRegistry()
	}
	// NB: a leading byte-order mark would otherwise be read as part of
	// the first key, and reported as an unknown field named after the
	// first comment line.
	data = stripBOM(data)
	if len(data) > MaxConfigBytes {
		return nil, &Error{File: name, Msg: fmt.Sprintf("config is %d bytes, more than the %s a stack config may hold", len(data), quantity.Size(MaxConfigBytes))}
	}
	src := &source{name: name, data: data, lines: bytes.Count(data, []byte("\n")) + 1}
	toks := tokenize(string(data), MaxTokens)
	if e := src.checkShape(toks); e != nil {
		return nil, e
	}
	file, err := parser.Parse(toks, 0)
	if err != nil {
		return nil, src.fromDecode(err, "", nil)
	}
	src.file = file
	var body ast.Node
	for i, doc := range file.Docs {
		if doc.Body == nil {
			continue
		}
		if body != nil {
			e := &Error{File: name, Path: "$", Msg: fmt.Sprintf("holds more than one YAML document (document %d starts here); a stack config is one document", i+1)}
			src.locate(e, doc.Body.GetToken())
			return nil, e
		}
		body = doc.Body
	}
	if body == nil || body.Type() == ast.NullType {
		return nil, &Error{File: name, Path: "$", Msg: "config is empty; it needs at least `version: 1` and a `model` (see `kvtier config default`)"}
	}
	if body.Type() != ast.MappingType {
		return nil, src.errAt("$", nil, "want a mapping at the top level, got %s", describeNode(body))
	}
	if e := src.checkAliases(body); e != nil {
		return nil, e
	}
	if err := src.checkTags(body); err != nil {
		return nil, err
	}
	// The version decides the schema: check it before strict decoding, so
	// a config of a newer version is refused for its version, not for the
	// first field this version does not know.
	if n, ok := src.lookup("$.version").(*ast.IntegerNode); ok {
		if v, ok := n.Value.(uint64); ok && v != Version {
			return nil, src.errAt("$.version", nil, "unsupported version %d (this kvtier reads version %d)", v, Version)
		}
	}
	raw := defaultRaw()
	if e := src.unknownField(body, reflect.TypeOf(raw)); e != nil {
		return nil, e
	}
	if err := decodeNode(body, &raw, yaml.Strict()); err != nil {
		return nil, src.fromDecode(err, "$", reflect.TypeOf(raw))
	}
	if err := src.required(&raw); err != nil {
		return nil, err
	}
	s, err := src.build(&raw, m)
	if err != nil {
		return nil, err
	}
	if p := s.check(); p != nil {
		return nil, src.errAt(p.path, p.cause, "%s", p.msg)
	}
	if err := src.checkPolicy(s, m.Policies); err != nil {
		return nil, err
	}
	return s, nil
}

// Raw YAML shapes. Fields the user may omit are pre-set by defaultRaw;
// required ones are checked for presence in the AST by required.
type rawStack struct {
	Version     strictInt   `yaml:"version"`
	Model       rawModel    `yaml:"model"`
	Tiers       []rawTier   `yaml:"tiers"`
	Policy      rawPolicy   `yaml:"policy"`
	WritePolicy string      `yaml:"write_policy"`
	Ranks       rawRanks    `yaml:"ranks"`
	Metrics     rawEndpoint `yaml:"metrics"`
	API         rawEndpoint `yaml:"api"`
}

type rawModel struct {
	PageTokens strictInt    `yaml:"page_tokens"`
	Payloads   []rawPayload `yaml:"payloads"`
}

type rawPayload struct {
	Name      string        `yaml:"name"`
	PageBytes quantity.Size `yaml:"page_bytes"`
}

type rawTier struct {
	Name   string     `yaml:"name"`
	Role   string     `yaml:"role"`
	Use    string     `yaml:"use"`
	Index  *rawIndex  `yaml:"index"`
	Plugin *rawPlugin `yaml:"plugin"`
	Config ast.Node   `yaml:"config"`
}

type rawIndex struct {
	Use    string     `yaml:"use"`
	Plugin *rawPlugin `yaml:"plugin"`
	Config ast.Node   `yaml:"config"`
}

type rawPlugin struct {
	Path   string   `yaml:"path"`
	SHA256 string   `yaml:"sha256"`
	Config ast.Node `yaml:"config"`
}

type rawPolicy struct {
	Evictor string             `yaml:"evictor"`
	Params  map[string]float64 `yaml:"params"`
	Planner string             `yaml:"planner"`
	Shadow  []string           `yaml:"shadow"`
}

type rawRanks struct {
	WorldSize strictInt `yaml:"world_size"`
	Rank      strictInt `yaml:"rank"`
}

type rawEndpoint struct {
	Listen string `yaml:"listen"`
}

func defaultRaw() rawStack {
	return rawStack{
		Policy:      rawPolicy{Evictor: DefaultEvictor, Planner: string(DefaultPlanner)},
		WritePolicy: string(DefaultWritePolicy),
		Ranks:       rawRanks{WorldSize: defaultRanksWorldSize},
		Metrics:     rawEndpoint{Listen: DefaultMetricsListen},
		API:         rawEndpoint{Listen: DefaultAPIListen},
	}
}

// decodeNode is yaml.NodeToValue that turns a panic of the decoder (a bug
// of goccy/go-yaml on odd input, found by FuzzLoad) into an error at the
// node, so a bad config never takes the process down.
func decodeNode(node ast.Node, v any, opts ...yaml.DecodeOption) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = nodeErr(node, "the YAML decoder failed on this value (%v); simplify it", r)
		}
	}()
	return yaml.NodeToValue(node, v, opts...)
}

// checkTags refuses a tag without a value (`tiers: !x`), on which the
// decoder dereferences nil (found by FuzzLoad).
func (s *source) checkTags(body ast.Node) error {
	var bad *ast.TagNode
	ast.Walk(visitor(func(n ast.Node) bool {
		if t, ok := n.(*ast.TagNode); ok && bad == nil && (t.Value == nil || t.Value.Type() == ast.NullType) {
			bad = t
		}
		return bad == nil
	}), body)
	if bad == nil {
		return nil
	}
	e := &Error{File: s.name, Path: bad.GetPath(), Msg: fmt.Sprintf("tag %s has no value", bad.Start.Value)}
	s.locate(e, bad.GetToken())
	return e
}

// strictInt is an int that refuses anything but a YAML integer (the
// decoder would otherwise truncate 512.5 to 512 or accept "1e3").
type strictInt int

func (i *strictInt) UnmarshalYAML(node ast.Node) error {
	n, ok := node.(*ast.IntegerNode)
	if sn, isStr := node.(*ast.StringNode); isStr && !ok && isPlainDigits(sn) {
		// The parser reads an integer too large for 64 bits as a string.
		return nodeErr(node, "%s is out of range", quantity.Clip(sn.Value, 64))
	}
	if !ok {
		return nodeErr(node, "want an integer, got %s", describeNode(node))
	}
	var v int64
	switch x := n.Value.(type) {
	case int64:
		v = x
	case uint64:
		if x > 1<<40 {
			return nodeErr(node, "%d is out of range", x)
		}
		v = int64(x)
	default:
		return nodeErr(node, "want an integer, got %s", describeNode(node))
	}
	if v != int64(int(v)) || v > 1<<40 || v < -(1<<40) {
		return nodeErr(node, "%d is out of range", v)
	}
	*i = strictInt(v)
	return nil
}

// isPlainDigits reports whether a string node is an unquoted run of
// digits with an optional sign.
func isPlainDigits(n *ast.StringNode) bool {
	tok := n.GetToken()
	if tok == nil || tok.Type == token.DoubleQuoteType || tok.Type == token.SingleQuoteType || n.Value == "" {
		return false
	}
	v := strings.TrimPrefix(n.Value, "-")
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
	}
	return v != ""
}

// present reports whether path holds a non-null value.
func (s *source) present(path string) bool {
	n := s.lookup(path)
	return n != nil && n.Type() != ast.NullType
}

// required reports the first required field that is absent or null.
func (s *source) required(raw *rawStack) error {
	need := []struct{ path, what string }{
		{"$.version", "the schema version (version: 1)"},
		{"$.model", "the model geometry (page_tokens and payloads)"},
		{"$.model.page_tokens", "tokens per page (e.g. 512)"},
		{"$.model.payloads", "the payload kinds (e.g. [{name: kv, page_bytes: 2.75MiB}])"},
	}
	for i := range raw.Model.Payloads {
		p := fmt.Sprintf("$.model.payloads[%d]", i)
		need = append(need,
			struct{ path, what string }{p + ".name", "the payload's name"},
			struct{ path, what string }{p + ".page_bytes", "the payload's bytes per page (e.g. 2.75MiB)"})
	}
	for i, t := range raw.Tiers {
		p := fmt.Sprintf("$.tiers[%d]", i)
		need = append(need,
			struct{ path, what string }{p + ".name", "the tier's instance name"},
			struct{ path, what string }{p + ".role", "the tier's role (pool, slab or store)"})
		for _, pl := range []struct {
			path string
			p    *rawPlugin
		}{{p + ".plugin", t.Plugin}, {p + ".index.plugin", indexPlugin(t.Index)}} {
			if pl.p != nil {
				need = append(need,
					struct{ path, what string }{pl.path + ".path", "the plugin binary's path"},
					struct{ path, what string }{pl.path + ".sha256", "the plugin binary's SHA-256"})
			}
		}
	}
	for _, n := range need {
		if !s.present(n.path) {
			return s.errAt(n.path, nil, "missing required field: %s", n.what)
		}
	}
	return nil
}

func indexPlugin(ix *rawIndex) *rawPlugin {
	if ix == nil {
		return nil
	}
	return ix.Plugin
}

// build turns the raw shapes into a Stack, decoding module configs.
func (s *source) build(raw *rawStack, m Modules) (*Stack, error) {
	st := &Stack{
		Version: int(raw.Version),
		Payload: tiers.PayloadGeometry{
			PageTokens: int(raw.Model.PageTokens),
			Kinds:      make([]tiers.PayloadSpec, 0, len(raw.Model.Payloads)),
		},
		Tiers:       make([]Tier, 0, len(raw.Tiers)),
		Policy:      Policy{Evictor: raw.Policy.Evictor, Params: raw.Policy.Params, Planner: Planner(raw.Policy.Planner), Shadow: raw.Policy.Shadow},
		WritePolicy: WritePolicy(raw.WritePolicy),
		Ranks:       Ranks{WorldSize: int(raw.Ranks.WorldSize), Rank: int(raw.Ranks.Rank)},
		Metrics:     Endpoint{Listen: raw.Metrics.Listen},
		API:         Endpoint{Listen: raw.API.Listen},
	}
	if st.Policy.Params == nil {
		st.Policy.Params = map[string]float64{}
	}
	for _, p := range raw.Model.Payloads {
		st.Payload.Kinds = append(st.Payload.Kinds, tiers.PayloadSpec{Name: p.Name, PageBytes: int64(p.PageBytes)})
	}
	for i, rt := range raw.Tiers {
		path := fmt.Sprintf("$.tiers[%d]", i)
		t := Tier{Name: rt.Name, Role: Role(rt.Role), Use: rt.Use}
		if t.Role.rank() < 0 {
			return nil, s.errAt(path+".role", nil, "unknown role %s (known: pool, slab, store)", quantity.Quote(string(rt.Role)))
		}
		var err error
		if t.Plugin, err = s.plugin(path, rt.Plugin); err != nil {
			return nil, err
		}
		if rt.Use != "" && rt.Plugin == nil {
			roleID, _ := t.Role.TypeID()
			cfg, lookupErr := m.Tiers.NewConfig(roleID, rt.Use)
			if lookupErr != nil {
				return nil, s.errAt(path+".use", lookupErr, "no %s module named %s is registered (known: %s)", t.Role, quantity.Quote(rt.Use), knownList(tierNames(m.Tiers, roleID)))
			}
			if t.Config, err = s.decodeModule(path+".config", rt.Config, cfg, string(roleID)+"/"+rt.Use); err != nil {
				return nil, err
			}
		} else if rt.Config != nil && rt.Config.Type() != ast.NullType && rt.Plugin != nil && rt.Use == "" {
			return nil, s.errAt(path+".config", nil, "a plugin tier's config goes under plugin.config")
		}
		if rt.Index != nil {
			ix := &IndexSpec{Use: rt.Index.Use}
			if ix.Plugin, err = s.plugin(path+".index", rt.Index.Plugin); err != nil {
				return nil, err
			}
			if rt.Index.Use != "" && rt.Index.Plugin == nil {
				reg, lookupErr := m.Indexes.Lookup(indexes.IndexV1, rt.Index.Use)
				if lookupErr != nil {
					return nil, s.errAt(path+".index.use", lookupErr, "no index module named %s is registered (known: %s)", quantity.Quote(rt.Index.Use), knownList(m.Indexes.Names(indexes.IndexV1)))
				}
				var cfg any
				if reg.NewConfig != nil {
					cfg = reg.NewConfig()
				}
				if ix.Config, err = s.decodeModule(path+".index.config", rt.Index.Config, cfg, reg.FullID()); err != nil {
					return nil, err
				}
			} else if rt.Index.Config != nil && rt.Index.Config.Type() != ast.NullType && rt.Index.Plugin != nil && rt.Index.Use == "" {
				return nil, s.errAt(path+".index.config", nil, "a plugin index's config goes under plugin.config")
			}
			t.Index = ix
		}
		st.Tiers = append(st.Tiers, t)
	}
	return st, nil
}

func tierNames(r *tiers.Registry, role registry.TypeID) []string {
	switch role {
	case tiers.PoolV1:
		return r.Pools.Names(role)
	case tiers.SlabV1:
		return r.Slabs.Names(role)
	case tiers.StoreV1:
		return r.Stores.Names(role)
	}
	return nil
}

func knownList(names []string) string {
	if len(names) == 0 {
		return "none registered in this build"
	}
	return strings.Join(names, ", ")
}

// decodeModule decodes node strictly into cfg (a module's fresh config
// pointer, or nil for a module that takes none).
func (s *source) decodeModule(path string, node ast.Node, cfg any, module string) (any, error) {
	empty := node == nil || node.Type() == ast.NullType
	if cfg == nil {
		if !empty {
			return nil, s.errAt(path, nil, "module %s takes no config; remove this block", module)
		}
		return nil, nil
	}
	if reflect.TypeOf(cfg).Kind() != reflect.Pointer {
		// A broken registration, not a broken config: say whose.
		return nil, s.errAt(path, nil, "module %s: NewConfig returned %T, want a pointer to a struct", module, cfg)
	}
	if !empty {
		if e := s.unknownField(node, reflect.TypeOf(cfg)); e != nil {
			e.Msg = fmt.Sprintf("%s (config of %s)", e.Msg, module)
			return nil, e
		}
		if err := decodeNode(node, cfg, yaml.Strict()); err != nil {
			e := s.fromDecode(err, path, reflect.TypeOf(cfg))
			e.Msg = fmt.Sprintf("%s (config of %s)", e.Msg, module)
			return nil, e
		}
	}
	return cfg, nil
}

// plugin converts a plugin block, keeping its config as canonical YAML.
func (s *source) plugin(path string, rp *rawPlugin) (*PluginSpec, error) {
	if rp == nil {
		return nil, nil
	}
	p := &PluginSpec{Path: rp.Path, SHA256: rp.SHA256}
	if rp.Config != nil && rp.Config.Type() != ast.NullType {
		b, err := canonicalYAML(rp.Config)
		if err != nil {
			return nil, s.errAt(path+".plugin.config", err, "cannot re-encode the plugin's config: %v", err)
		}
		p.Config = b
	}
	return p, nil
}

// canonicalYAML re-encodes a YAML value with keys in the written order, so
// that a Stack printed by String and loaded again holds the same bytes.
func canonicalYAML(node ast.Node) ([]byte, error) {
	var v any
	if err := decodeNode(node, &v, yaml.UseOrderedMap()); err != nil {
		return nil, err
	}
	return yaml.Marshal(v)
}

// checkPolicy checks the evictor's name and params by building it: policies
// are deterministic values, cheap to build, and building is the only way to
// apply each policy's own parameter rules. An offline policy (one that
// needs replay's future knowledge) refuses here, by name.
func (s *source) checkPolicy(st *Stack, r *policy.Registry) error {
	reg, err := r.Lookup(policy.EvictorV1, st.Policy.Evictor)
	if err != nil {
		return s.errAt("$.policy.evictor", err, "no eviction policy named %s is registered (known: %s)", quantity.Quote(st.Policy.Evictor), knownList(r.Names(policy.EvictorV1)))
	}
	if reg.Factory == nil {
		return s.errAt("$.policy.evictor", nil, "policy %s has no factory (a broken registration)", reg.FullID())
	}
	params := make(map[string]float64, len(st.Policy.Params))
	for k, v := range st.Policy.Params {
		params[k] = v
	}
	if _, err := reg.Factory(policy.Options{Params: params}); err != nil {
		path := "$.policy.evictor"
		if len(st.Policy.Params) > 0 {
			path = "$.policy.params"
		}
		return s.errAt(path, err, "policy %s refuses this configuration: %v", quantity.Quote(st.Policy.Evictor), err)
	}
	if err := CheckShadow(st.Policy.Shadow, r); err != nil {
		var se *ShadowError
		if errors.As(err, &se) {
			return s.errAt(fmt.Sprintf("$.policy.shadow[%d]", se.Index), se.Err, "%s", se.Msg)
		}
		return s.errAt("$.policy.shadow", err, "%v", err)
	}
	return nil
}

// MaxShadows bounds the shadow policies of a stack: each runs a replay
// tree per tier on serve's CPU.
const MaxShadows = 8

// ShadowError says which entry of a shadow list is refused and why.
type ShadowError struct {
	Index int
	Msg   string
	Err   error
}

func (e *ShadowError) Error() string { return fmt.Sprintf("shadow policy %d: %s", e.Index, e.Msg) }
func (e *ShadowError) Unwrap() error { return e.Err }

// CheckShadow checks a list of shadow policies (serve's --shadow, the
// stack's policy.shadow): at most MaxShadows, each registered in r, built
// with default params and online (no future knowledge), none twice.
func CheckShadow(names []string, r *policy.Registry) error {
	if len(names) > MaxShadows {
		return &ShadowError{Index: MaxShadows, Msg: fmt.Sprintf("%d shadow policies, at most %d", len(names), MaxShadows)}
	}
	seen := map[string]bool{}
	for i, name := range names {
		reg, err := r.Lookup(policy.EvictorV1, name)
		if err != nil {
			return &ShadowError{Index: i, Err: err, Msg: fmt.Sprintf("no eviction policy named %s is registered (known: %s)", quantity.Quote(name), knownList(r.Names(policy.EvictorV1)))}
		}
		if seen[name] {
			return &ShadowError{Index: i, Msg: fmt.Sprintf("policy %s is named twice", quantity.Quote(name))}
		}
		seen[name] = true
		if reg.Factory == nil {
			return &ShadowError{Index: i, Msg: fmt.Sprintf("policy %s has no factory (a broken registration)", reg.FullID())}
		}
		if _, err := reg.Factory(policy.Options{Params: map[string]float64{}}); err != nil {
			return &ShadowError{Index: i, Err: err, Msg: fmt.Sprintf("policy %s cannot run as a shadow (shadows run online, with default params): %v", quantity.Quote(name), err)}
		}
	}
	return nil
}
