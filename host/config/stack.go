// Package config is the YAML schema of a whole kvtier stack: the model's
// page geometry and payload kinds, the ordered tier list (each tier's own
// config decoded strictly by its module's registration), the eviction
// policy, the write policy, the rank placement, and the metrics and API
// endpoints. It loads, defaults, validates and prints stacks, and ships the
// embedded default stack.
//
// Every problem in a config is an *Error naming the file, line, column and
// YAML path ("$.tiers[1].config.size") with the source line shown. Unknown
// fields are errors at every level, module configs included. A field that
// is null (`write_policy:` with no value) counts as omitted: it takes its
// default, or is reported missing when required.
//
// Sizes and token counts are quantity.Size and quantity.Tokens, the one
// syntax every module shares ("64GiB", "2.75MiB", "3M"). A module's
// Validate may return a registry.FieldError to have its error reported at
// the field's line. Input is bounded before the YAML parser sees it
// (MaxConfigBytes, MaxDepth, MaxMappingKeys, MaxTokens, MaxDocuments,
// MaxValues once aliases expand), and every message quotes and clips the
// text it copies from the config (quantity.Quote).
//
// This package only describes stacks. It must never open a tier, an index
// or a plugin, touch the file system beyond reading the config, or keep
// package-level mutable state: what it returns is a value the host acts on.
package config

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/registry"
	"github.com/kvtier/kvtier/tiers"
)

// Version is the config schema version this package reads.
const Version = 1

// Limits on the model geometry. They are sanity bounds that catch a unit
// mistake, not performance advice.
const (
	// MaxPageTokens bounds page_tokens.
	MaxPageTokens = 1 << 20
	// MaxPayloadKinds is the number of kinds a tiers.PayloadKind can index.
	MaxPayloadKinds = 256
	// MaxPageBytes bounds a payload's page_bytes.
	MaxPageBytes = quantity.GiB
)

// Role is a tier's role in the stack, as written in YAML.
type Role string

// Tier roles, in the order they appear in a stack (top to bottom).
const (
	// RolePool is a device page pool (L1), Pool v1.
	RolePool Role = "pool"
	// RoleSlab is the shared host-memory hub (L2), Slab v1.
	RoleSlab Role = "slab"
	// RoleStore is a content-addressed tier below the slab, Store v1.
	RoleStore Role = "store"
)

// TypeID returns the registry role ID of r.
func (r Role) TypeID() (registry.TypeID, error) { return tiers.Role(string(r)) }

func (r Role) rank() int {
	switch r {
	case RolePool:
		return 0
	case RoleSlab:
		return 1
	case RoleStore:
		return 2
	}
	return -1
}

// WritePolicy says when the host backs new pages up to the tier below.
type WritePolicy string

// Write policies.
const (
	// WriteThrough backs every new node up from L1 to L2 as it is inserted.
	WriteThrough WritePolicy = "write_through"
	// WriteThroughSelective backs up only nodes that were hit before.
	WriteThroughSelective WritePolicy = "write_through_selective"
	// WriteBack writes a node down only when it is evicted from above.
	WriteBack WritePolicy = "write_back"
)

// Planner selects the eviction planner's algorithm.
type Planner string

// Planners.
const (
	// PlannerHeap pops victims from a heap ordered by the policy.
	PlannerHeap Planner = "heap"
	// PlannerGreedy rescans the candidates for each victim (the reference).
	PlannerGreedy Planner = "greedy"
)

// Stack is a loaded, validated stack config.
type Stack struct {
	// Version is the schema version (1).
	Version int
	// Payload is the page geometry every tier shares: tokens per page and
	// the payload kinds in tiers.PayloadKind order.
	Payload tiers.PayloadGeometry
	// Tiers lists the tiers from the top (L1) to the bottom. It may be
	// empty: replay in metadata mode needs no tiers.
	Tiers []Tier
	// Policy is the eviction policy of the radix tree.
	Policy Policy
	// WritePolicy says when new pages are backed up.
	WritePolicy WritePolicy
	// Ranks places this host in its context-parallel group.
	Ranks Ranks
	// Metrics is the Prometheus endpoint.
	Metrics Endpoint
	// API is the engine-facing API endpoint.
	API Endpoint
}

// Tier is one tier of the stack: an in-process module chosen by name (Use)
// or a plugin binary (Plugin), never both.
type Tier struct {
	// Name is the tier's instance name, unique in the stack.
	Name string
	// Role is the tier's role.
	Role Role
	// Use is the registered module name; empty for a plugin tier.
	Use string
	// Config is the module's decoded config: the pointer its registration's
	// NewConfig returned, filled from YAML; nil when the module takes none
	// or for a plugin tier.
	Config any
	// Index is the store's index, or nil. Only stores take one.
	Index *IndexSpec
	// Plugin is the plugin binary serving this tier, or nil.
	Plugin *PluginSpec
}

// IndexSpec selects a store's Index v1: an in-process module (Use, Config)
// or a plugin, never both.
type IndexSpec struct {
	// Use is the registered index name; empty for a plugin index.
	Use string
	// Config is the index module's decoded config, or nil.
	Config any
	// Plugin is the plugin binary serving the index, or nil.
	Plugin *PluginSpec
}

// PluginSpec names a plugin binary pinned by its SHA-256.
type PluginSpec struct {
	// Path is the binary's path, relative to the working directory of the
	// process that loads the stack when not absolute.
	Path string
	// SHA256 is the binary's SHA-256, 64 hex digits.
	SHA256 string
	// Config is the plugin's own config as canonical YAML (keys in the
	// order written), for the plugin to decode itself; nil when absent.
	Config []byte
}

// Policy selects the eviction policy.
type Policy struct {
	// Evictor is the policy's registered name, e.g. "lru".
	Evictor string
	// Params are policy-specific settings; the policy refuses unknown keys.
	// Never nil after Load.
	Params map[string]float64
	// Planner is the eviction planner's algorithm.
	Planner Planner
	// Shadow names policies that serve runs as shadows beside the live
	// one: metadata-only replay trees at the live tiers' capacities, fed
	// the same lookups, for online A/B (docs/policies.md). Empty: none.
	Shadow []string
}

// Ranks places the host in its context-parallel group.
type Ranks struct {
	// WorldSize is the number of ranks (1: no peers).
	WorldSize int
	// Rank is this host's rank, 0 <= Rank < WorldSize.
	Rank int
}

// Endpoint is a listening address.
type Endpoint struct {
	// Listen is "host:port", or the empty string ("") to disable the
	// endpoint; omitted or null takes the default.
	Listen string
}

// Defaults of the optional settings, applied when a config omits them.
const (
	DefaultEvictor        = "adaptive"
	DefaultPlanner        = PlannerHeap
	DefaultWritePolicy    = WriteThrough
	DefaultMetricsListen  = "127.0.0.1:9400"
	DefaultAPIListen      = "127.0.0.1:9401"
	defaultRanksWorldSize = 1
)

// The model geometry of the embedded default stack (default.yaml). A config
// must state its own: page_tokens and payloads are required.
const (
	DefaultPageTokens   = 512
	DefaultPayloadName  = "kv"
	DefaultPayloadBytes = 2816 * quantity.KiB // 2.75MiB, an MLA page of 512 tokens on one rank
)

// GeometryValidator is an optional interface of a module config: a module
// whose config implements it is told the stack's payload geometry at load
// time and refuses one it cannot serve (for example a page size that is not
// a multiple of its alignment). The error is reported at the tier's config.
type GeometryValidator interface {
	ValidateGeometry(g tiers.PayloadGeometry) error
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

var sha256Pattern = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// problem is one validation failure at a YAML path.
type problem struct {
	path  string
	msg   string
	cause error
}

func problemf(path string, cause error, format string, args ...any) *problem {
	return &problem{path: path, msg: fmt.Sprintf(format, args...), cause: cause}
}

// Validate checks the stack's own rules (the same rules Load applies, less
// the registry look-ups, which need the modules): version, geometry, tier
// names, roles and order, use xor plugin, plugin pins, module config
// Validate and ValidateGeometry, policy, write policy, ranks, endpoints.
// The error is an *Error with the YAML path of the first problem.
func (s *Stack) Validate() error {
	if p := s.check(); p != nil {
		return &Error{Path: p.path, Msg: p.msg, Err: p.cause}
	}
	return nil
}

func (s *Stack) check() *problem {
	if s.Version != Version {
		return problemf("$.version", nil, "unsupported version %d (this kvtier reads version %d)", s.Version, Version)
	}
	if p := checkGeometry(s.Payload); p != nil {
		return p
	}
	if p := s.checkTiers(); p != nil {
		return p
	}
	if s.Policy.Evictor == "" {
		return problemf("$.policy.evictor", nil, "must name an eviction policy")
	}
	switch s.Policy.Planner {
	case PlannerHeap, PlannerGreedy:
	default:
		return problemf("$.policy.planner", nil, "unknown planner %s (known: %s, %s)", quantity.Quote(string(s.Policy.Planner)), PlannerHeap, PlannerGreedy)
	}
	switch s.WritePolicy {
	case WriteThrough, WriteThroughSelective, WriteBack:
	default:
		return problemf("$.write_policy", nil, "unknown write policy %s (known: %s, %s, %s)", quantity.Quote(string(s.WritePolicy)), WriteThrough, WriteThroughSelective, WriteBack)
	}
	if s.Ranks.WorldSize < 1 {
		return problemf("$.ranks.world_size", nil, "must be at least 1, got %d", s.Ranks.WorldSize)
	}
	if s.Ranks.Rank < 0 || s.Ranks.Rank >= s.Ranks.WorldSize {
		return problemf("$.ranks.rank", nil, "must be in [0, %d) for world_size %d, got %d", s.Ranks.WorldSize, s.Ranks.WorldSize, s.Ranks.Rank)
	}
	if p := checkListen("$.metrics.listen", s.Metrics.Listen); p != nil {
		return p
	}
	if p := checkListen("$.api.listen", s.API.Listen); p != nil {
		return p
	}
	if s.Metrics.Listen != "" && s.Metrics.Listen == s.API.Listen {
		return problemf("$.api.listen", nil, "%s is also the metrics address; give the API its own port", s.API.Listen)
	}
	return nil
}

func checkGeometry(g tiers.PayloadGeometry) *problem {
	if g.PageTokens < 1 || g.PageTokens > MaxPageTokens {
		return problemf("$.model.page_tokens", nil, "must be in [1, %d], got %d", MaxPageTokens, g.PageTokens)
	}
	if len(g.Kinds) == 0 {
		return problemf("$.model.payloads", nil, "must list at least one payload kind (e.g. {name: kv, page_bytes: 2.75MiB})")
	}
	if len(g.Kinds) > MaxPayloadKinds {
		return problemf("$.model.payloads", nil, "lists %d payload kinds, at most %d", len(g.Kinds), MaxPayloadKinds)
	}
	seen := map[string]int{}
	for i, k := range g.Kinds {
		path := fmt.Sprintf("$.model.payloads[%d]", i)
		if !namePattern.MatchString(k.Name) {
			return problemf(path+".name", nil, "payload name %s must start with a letter or digit and use only letters, digits, '_', '.' and '-'", quantity.Quote(k.Name))
		}
		if j, dup := seen[k.Name]; dup {
			return problemf(path+".name", nil, "payload %s is already defined at $.model.payloads[%d]", quantity.Quote(k.Name), j)
		}
		seen[k.Name] = i
		if k.PageBytes <= 0 {
			return problemf(path+".page_bytes", nil, "must be positive, got %d bytes", k.PageBytes)
		}
		if k.PageBytes > int64(MaxPageBytes) {
			return problemf(path+".page_bytes", nil, "%s is more than %s; a page of one payload is kilobytes to megabytes", quantity.Size(k.PageBytes), MaxPageBytes)
		}
	}
	return nil
}

func (s *Stack) checkTiers() *problem {
	seen := map[string]int{}
	prev := -1
	count := map[Role]int{}
	hasSlab := false
	for _, t := range s.Tiers {
		if t.Role == RoleSlab {
			hasSlab = true
		}
	}
	for i, t := range s.Tiers {
		path := fmt.Sprintf("$.tiers[%d]", i)
		if !namePattern.MatchString(t.Name) {
			return problemf(path+".name", nil, "tier name %s must start with a letter or digit and use only letters, digits, '_', '.' and '-'", quantity.Quote(t.Name))
		}
		if j, dup := seen[t.Name]; dup {
			return problemf(path+".name", nil, "tier name %s is already used by $.tiers[%d]; names must be unique", quantity.Quote(t.Name), j)
		}
		seen[t.Name] = i
		r := t.Role.rank()
		if r < 0 {
			return problemf(path+".role", nil, "unknown role %s (known: pool, slab, store)", quantity.Quote(string(t.Role)))
		}
		if r < prev {
			return problemf(path+".role", nil, "a %s tier cannot come after a %s tier: list tiers top to bottom (pool, then slab, then stores)", t.Role, s.Tiers[i-1].Role)
		}
		prev = r
		count[t.Role]++
		if t.Role != RoleStore && count[t.Role] > 1 {
			return problemf(path+".role", nil, "a stack has at most one %s tier; %s is the second", t.Role, quantity.Quote(t.Name))
		}
		if (t.Role == RolePool || t.Role == RoleStore) && !hasSlab {
			return problemf(path+".role", nil, "%s tier %s needs a slab tier: pools and stores move pages through the slab", t.Role, quantity.Quote(t.Name))
		}
		if p := checkModule(path, t.Use, t.Plugin, t.Config); p != nil {
			return p
		}
		if t.Index != nil {
			if t.Role != RoleStore {
				return problemf(path+".index", nil, "only store tiers take an index; %s is a %s", quantity.Quote(t.Name), t.Role)
			}
			if p := checkModule(path+".index", t.Index.Use, t.Index.Plugin, t.Index.Config); p != nil {
				return p
			}
		}
		for _, cfg := range []struct {
			path string
			v    any
		}{{path + ".config", t.Config}, {path + ".index.config", indexConfig(t.Index)}} {
			if v, ok := cfg.v.(interface{ Validate() error }); ok {
				if err := v.Validate(); err != nil {
					return problemf(fieldPath(cfg.path, err), err, "%v", err)
				}
			}
			if v, ok := cfg.v.(GeometryValidator); ok {
				if err := v.ValidateGeometry(s.Payload); err != nil {
					return problemf(fieldPath(cfg.path, err), err, "this module cannot serve the stack's payload geometry ($.model): %v", err)
				}
			}
		}
	}
	return nil
}

// fieldPath returns the YAML path of the field a module's validation
// error names (a registry.FieldError), below the module's config at path;
// path itself when the error names no field.
func fieldPath(path string, err error) string {
	var fe *registry.FieldError
	if !errors.As(err, &fe) || fe.Field == "" {
		return path
	}
	if strings.HasPrefix(fe.Field, "[") {
		return path + fe.Field
	}
	return path + "." + fe.Field
}

func indexConfig(ix *IndexSpec) any {
	if ix == nil {
		return nil
	}
	return ix.Config
}

// checkModule checks the use-xor-plugin rule of a tier or index at path.
func checkModule(path, use string, plugin *PluginSpec, cfg any) *problem {
	switch {
	case use != "" && plugin != nil:
		return problemf(path, nil, "set either use (an in-process module) or plugin (a binary), not both")
	case use == "" && plugin == nil:
		return problemf(path+".use", nil, "missing: set use (a registered module name) or plugin (a binary)")
	case plugin != nil:
		if cfg != nil {
			return problemf(path+".config", nil, "a plugin's config goes under plugin.config")
		}
		if plugin.Path == "" {
			return problemf(path+".plugin.path", nil, "missing: the plugin binary's path")
		}
		if !sha256Pattern.MatchString(plugin.SHA256) {
			return problemf(path+".plugin.sha256", nil, "want the binary's SHA-256 as 64 hex digits (sha256sum %s), got %s", quantity.Clip(plugin.Path, maxNameBytes), quantity.Quote(plugin.SHA256))
		}
	}
	return nil
}

func checkListen(path, addr string) *problem {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return problemf(path, err, "want host:port (e.g. 127.0.0.1:9400), got %s: %v", quantity.Quote(addr), err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return problemf(path, nil, "port %s of %s is not a number in [0, 65535]", quantity.Quote(port), quantity.Quote(addr))
	}
	return nil
}
