package config

import (
	"fmt"

	"github.com/goccy/go-yaml"

	"github.com/kvtier/kvtier/quantity"
)

// Output shapes for String: the same field names as the input, with module
// configs as the decoded values and plugin configs re-expanded.
type outStack struct {
	Version     int         `yaml:"version"`
	Model       outModel    `yaml:"model"`
	Tiers       []outTier   `yaml:"tiers"`
	Policy      outPolicy   `yaml:"policy"`
	WritePolicy string      `yaml:"write_policy"`
	Ranks       outRanks    `yaml:"ranks"`
	Metrics     rawEndpoint `yaml:"metrics"`
	API         rawEndpoint `yaml:"api"`
}

type outModel struct {
	PageTokens int          `yaml:"page_tokens"`
	Payloads   []rawPayload `yaml:"payloads"`
}

type outTier struct {
	Name   string     `yaml:"name"`
	Role   string     `yaml:"role"`
	Use    string     `yaml:"use,omitempty"`
	Index  *outIndex  `yaml:"index,omitempty"`
	Plugin *outPlugin `yaml:"plugin,omitempty"`
	Config any        `yaml:"config,omitempty"`
}

type outIndex struct {
	Use    string     `yaml:"use,omitempty"`
	Plugin *outPlugin `yaml:"plugin,omitempty"`
	Config any        `yaml:"config,omitempty"`
}

type outPlugin struct {
	Path   string `yaml:"path"`
	SHA256 string `yaml:"sha256"`
	Config any    `yaml:"config,omitempty"`
}

type outPolicy struct {
	Evictor string             `yaml:"evictor"`
	Params  map[string]float64 `yaml:"params,omitempty"`
	Planner string             `yaml:"planner"`
	Shadow  []string           `yaml:"shadow,omitempty"`
}

type outRanks struct {
	WorldSize int `yaml:"world_size"`
	Rank      int `yaml:"rank"`
}

// String returns the stack as YAML that Load turns back into an equal
// Stack (given the same modules). Sizes are written with units.
func (s *Stack) String() string {
	b, err := s.MarshalYAML()
	if err != nil {
		return fmt.Sprintf("# cannot print stack: %v\n", err)
	}
	return string(b)
}

// MarshalYAML returns the YAML of String, or the error that stopped it (a
// module config that cannot be encoded).
func (s *Stack) MarshalYAML() ([]byte, error) {
	out := outStack{
		Version:     s.Version,
		Model:       outModel{PageTokens: s.Payload.PageTokens},
		Tiers:       make([]outTier, 0, len(s.Tiers)),
		Policy:      outPolicy{Evictor: s.Policy.Evictor, Params: s.Policy.Params, Planner: string(s.Policy.Planner), Shadow: s.Policy.Shadow},
		WritePolicy: string(s.WritePolicy),
		Ranks:       outRanks{WorldSize: s.Ranks.WorldSize, Rank: s.Ranks.Rank},
		Metrics:     rawEndpoint{Listen: s.Metrics.Listen},
		API:         rawEndpoint{Listen: s.API.Listen},
	}
	for _, k := range s.Payload.Kinds {
		out.Model.Payloads = append(out.Model.Payloads, rawPayload{Name: k.Name, PageBytes: quantity.Size(k.PageBytes)})
	}
	for _, t := range s.Tiers {
		ot := outTier{Name: t.Name, Role: string(t.Role), Use: t.Use, Config: t.Config}
		var err error
		if ot.Plugin, err = outPluginOf(t.Plugin); err != nil {
			return nil, fmt.Errorf("tier %s: %w", t.Name, err)
		}
		if t.Index != nil {
			ot.Index = &outIndex{Use: t.Index.Use, Config: t.Index.Config}
			if ot.Index.Plugin, err = outPluginOf(t.Index.Plugin); err != nil {
				return nil, fmt.Errorf("tier %s index: %w", t.Name, err)
			}
		}
		out.Tiers = append(out.Tiers, ot)
	}
	b, err := yaml.MarshalWithOptions(out, yaml.IndentSequence(true))
	if err != nil {
		return nil, fmt.Errorf("marshal stack: %w", err)
	}
	return b, nil
}

func outPluginOf(p *PluginSpec) (*outPlugin, error) {
	if p == nil {
		return nil, nil
	}
	op := &outPlugin{Path: p.Path, SHA256: p.SHA256}
	if len(p.Config) > 0 {
		var v any
		if err := yaml.UnmarshalWithOptions(p.Config, &v, yaml.UseOrderedMap()); err != nil {
			return nil, fmt.Errorf("plugin config: %w", err)
		}
		op.Config = v
	}
	return op, nil
}
