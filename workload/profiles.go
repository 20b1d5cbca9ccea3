package workload

import (
	"fmt"
	"slices"
	"strings"
)

// Profile is a named generator config: the default workload or one of the
// harder mixes that separate eviction policies (the adaptive policy's
// evidence in docs/policies.md). A profile fixes
// everything but the seed.
type Profile struct {
	// Name is what `kvtier generate --profile` and tests call it.
	Name string
	// Doc says what traffic the profile models.
	Doc string
	// Config returns the profile's config with the given seed.
	Config func(seed uint64) GeneratorConfig
}

// Profiles returns the built-in generator profiles, by name.
func Profiles() []Profile {
	return []Profile{
		{"default", "the embedded default: chat behind Zipf-popular system prompts, one-shot documents, scans", func(seed uint64) GeneratorConfig {
			c := DefaultGeneratorConfig()
			c.Seed = seed
			return c
		}},
		{"docs", "bursty document reuse: long documents each asked about once or a few times within a working set of open documents, then never again, beside a little chat", DocsConfig},
		{"idle", "conversations that go idle for long gaps (users who leave and come back) beside short-lived chat and scans", IdleConfig},
		{"agents", "a mix of chat and agent loops whose context grows by long tool results at every step", AgentsConfig},
		{"mixed", "every knob at once: bursty documents, idle conversations, agent loops, chat and scans", MixedConfig},
	}
}

// ProfileByName returns the profile called name.
func ProfileByName(name string) (Profile, error) {
	ps := Profiles()
	i := slices.IndexFunc(ps, func(p Profile) bool { return p.Name == name })
	if i < 0 {
		names := make([]string, len(ps))
		for j, p := range ps {
			names[j] = p.Name
		}
		return Profile{}, fmt.Errorf("generator profile %q: unknown (known: %s)", name, strings.Join(names, ", "))
	}
	return ps[i], nil
}

// DocsConfig is the "docs" profile: bursty document reuse.
func DocsConfig(seed uint64) GeneratorConfig {
	c := DefaultGeneratorConfig()
	c.Seed = seed
	c.Mix = Mix{Chat: 0.1, Document: 0.8, Scan: 0.1}
	c.ActiveDocuments = 512
	c.DocumentQuestions = 1.5
	return c
}

// IdleConfig is the "idle" profile: conversations with long idle gaps.
func IdleConfig(seed uint64) GeneratorConfig {
	c := DefaultGeneratorConfig()
	c.Seed = seed
	c.ActiveConversations = 256
	c.IdleShare = 0.3
	c.IdleRequests = 4000
	return c
}

// AgentsConfig is the "agents" profile: chat and agent loops.
func AgentsConfig(seed uint64) GeneratorConfig {
	c := DefaultGeneratorConfig()
	c.Seed = seed
	c.Mix = Mix{Chat: 0.4, Document: 0.05, Scan: 0.05, Agent: 0.5}
	c.ActiveAgents = 64
	c.AgentSteps = 12
	c.ToolTokens = Range{Min: 256, Max: 8192}
	c.AgentOutputTokens = Range{Min: 16, Max: 256}
	return c
}

// MixedConfig is the "mixed" profile: every knob at once.
func MixedConfig(seed uint64) GeneratorConfig {
	c := AgentsConfig(seed)
	c.Mix = Mix{Chat: 0.35, Document: 0.25, Scan: 0.1, Agent: 0.3}
	c.ActiveDocuments = 128
	c.DocumentQuestions = 3
	c.IdleShare = 0.2
	c.IdleRequests = 3000
	return c
}
